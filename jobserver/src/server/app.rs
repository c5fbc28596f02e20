//! One request, from parsed HTTP parts to a JSON reply: route, authenticate,
//! decode the body, run the handler in one database transaction. Kept apart
//! from the HTTP library so it reads as the list of endpoints it is.

use crate::server::auth;
use crate::server::db::Db;
use crate::server::db::to_json;
use crate::server::error::{ApiError, ApiResult};
use crate::server::jobs;
use crate::server::nodes::{self, Liveness};
use crate::server::routes::{self, Auth, Route};
use crate::server::status;
use crate::server::steps;
use gw_jobapi::types::{
    Heartbeat, RegisterNode, SetGlobalBatch, StepBegin, StepEnd, SubmitRequest,
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
        match route.auth() {
            Auth::Admin => self.check_admin(token),
            Auth::Job(id) => self.db.tx(|tx| steps::authorize(tx, id, token).map(|_| ())),
        }
    }

    fn check_admin(&self, token: &str) -> ApiResult<()> {
        if auth::same(token, &self.admin_token) {
            Ok(())
        } else {
            Err(ApiError::unauthorized(
                "this endpoint needs the admin token",
            ))
        }
    }

    /// Serves one request: the JSON reply, or the error to send.
    pub fn handle(&self, c: &Call<'_>) -> ApiResult<String> {
        let route = routes::parse(c.method, c.url)?;
        let token = auth::bearer(c.authorization)?;
        if route.auth() == Auth::Admin {
            self.check_admin(token)?;
        }
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
                to_json(&db.tx(|tx| nodes::register(tx, &self.live, &req, self.heartbeat_ms))?)
            }
            Route::Heartbeat(node) => {
                let req: Heartbeat = body(c)?;
                let url = self.server_url(c.host);
                to_json(&db.tx(|tx| nodes::heartbeat(tx, &self.live, node, &req, &url))?)
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
