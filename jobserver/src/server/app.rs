//! One request, from parsed HTTP parts to a JSON reply: route, authenticate,
//! decode the body, run the handler in one database transaction. Kept apart
//! from the HTTP library so it reads as the list of endpoints it is.

use crate::server::access::{self, Principal};
use crate::server::auth;
use crate::server::credentials;
use crate::server::db::Db;
use crate::server::db::to_json;
use crate::server::error::{ApiError, ApiResult};
use crate::server::jobs;
use crate::server::nodes::{self, Liveness};
use crate::server::routes::{self, Auth, Route};
use crate::server::status;
use crate::server::steps;
use gw_jobapi::types::{
    Heartbeat, IssueToken, RegisterNode, RevokedToken, Role, SetGlobalBatch, StepBegin, StepEnd,
    SubmitRequest,
};
use serde::de::DeserializeOwned;

/// Everything a request handler can reach.
pub struct App {
    pub db: Db,
    pub admin_token: String,
    pub live: Liveness,
    /// Interval agents are told to heartbeat at.
    pub heartbeat_ms: u64,
    /// `--advertise`: the URL workers are given as `GW_JOB_SERVER`; without
    /// it, the URL the agent itself used (its Host header).
    pub advertise: Option<String>,
    /// Fallback for requests without a Host header.
    pub listen_url: String,
}

/// The parts of an HTTP request the handlers use.
pub struct Call<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub authorization: Option<&'a str>,
    pub host: Option<&'a str>,
    pub body: &'a [u8],
}

fn body<T: DeserializeOwned>(c: &Call<'_>) -> ApiResult<T> {
    serde_json::from_slice(c.body).map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
}

impl App {
    /// Routes `c` and checks its token, from the request head alone: run
    /// before the body is read, so an unauthenticated client never gets a
    /// body buffered. [`App::handle`] checks again; this only refuses early.
    pub fn admit(&self, c: &Call<'_>) -> ApiResult<()> {
        let route = routes::parse(c.method, c.url)?;
        let token = auth::bearer(c.authorization)?;
        self.authorize(&route, token).map(|_| ())
    }

    /// Who signed a request for `route` with `token`, if they may call it;
    /// `None` for the step endpoints, signed by a job's worker token.
    fn authorize(&self, route: &Route<'_>, token: &str) -> ApiResult<Option<Principal>> {
        match route.auth() {
            Auth::Job(id) => self
                .db
                .tx(|tx| steps::authorize(tx, id, token).map(|_| None)),
            need => {
                let who = self
                    .db
                    .tx(|tx| access::identify(tx, &self.admin_token, token))?;
                access::allow(&who, need)?;
                Ok(Some(who))
            }
        }
    }

    /// Serves one request: the JSON reply, or the error to send.
    pub fn handle(&self, c: &Call<'_>) -> ApiResult<String> {
        let route = routes::parse(c.method, c.url)?;
        let token = auth::bearer(c.authorization)?;
        let who = self.authorize(&route, token)?;
        let db = &self.db;
        match route {
            Route::Submit => {
                let req: SubmitRequest = body(c)?;
                to_json(&db.tx(|tx| jobs::submit(tx, &req))?)
            }
            Route::ListJobs => to_json(&db.tx(status::list)?),
            Route::GetJob(id) => to_json(&db.tx(|tx| status::status(tx, id))?),
            Route::Events(id) => to_json(&db.tx(|tx| status::events(tx, id))?),
            Route::Cancel(id) => to_json(&db.tx(|tx| {
                jobs::cancel(tx, id)?;
                status::status(tx, id)
            })?),
            Route::SetGlobalBatch(id) => {
                let req: SetGlobalBatch = body(c)?;
                to_json(&db.tx(|tx| {
                    jobs::set_global_batch(tx, id, &req)?;
                    status::status(tx, id)
                })?)
            }
            Route::StepBegin(id) => to_json(&db.tx(|tx| {
                let job = steps::authorize(tx, id, token)?;
                steps::begin(tx, &job, &body::<StepBegin>(c)?)
            })?),
            Route::StepEnd(id) => to_json(&db.tx(|tx| {
                let job = steps::authorize(tx, id, token)?;
                steps::end(tx, &job, &body::<StepEnd>(c)?)
            })?),
            Route::Register => {
                let req: RegisterNode = body(c)?;
                let role = who.as_ref().map(Principal::role);
                if let Some(who) = &who {
                    access::allow(who, Auth::Node(Some(&req.node)))?;
                }
                let mut reply =
                    db.tx(|tx| nodes::register(tx, &self.live, &req, self.heartbeat_ms))?;
                if role == Some(Role::Admin) {
                    tracing::warn!(
                        "node {} registered with the admin token, which can run any program on \
                         every node: give its agent its own (gwjob node-token --node {})",
                        req.node,
                        req.node
                    );
                }
                reply.role = role;
                to_json(&reply)
            }
            Route::Heartbeat(node) => {
                let req: Heartbeat = body(c)?;
                let url = self.server_url(c.host);
                to_json(&db.tx(|tx| nodes::heartbeat(tx, &self.live, node, &req, &url))?)
            }
            Route::IssueToken => {
                let req: IssueToken = body(c)?;
                to_json(&db.tx(|tx| credentials::issue(tx, req.role, &req.name))?)
            }
            Route::RevokeToken(role, name) => {
                db.tx(|tx| credentials::revoke(tx, role, name))?;
                to_json(&RevokedToken {
                    role,
                    name: name.to_owned(),
                })
            }
        }
    }

    /// The job server's URL as workers should use it.
    fn server_url(&self, host: Option<&str>) -> String {
        match (&self.advertise, host) {
            (Some(a), _) => a.trim_end_matches('/').to_owned(),
            (None, Some(h)) if !h.trim().is_empty() => format!("http://{}", h.trim()),
            _ => self.listen_url.clone(),
        }
    }

    /// One pass of the liveness check: nodes silent for too long are lost.
    pub fn check_nodes(&self) -> ApiResult<()> {
        let timeout = self.live.timeout;
        let lost = self.db.tx(|tx| {
            let expired = self.live.expired();
            for n in &expired {
                nodes::mark_lost(tx, n, timeout)?;
            }
            Ok(expired)
        })?;
        self.live.forget_if_silent(&lost);
        Ok(())
    }
}
