//! The URL space of the job server, parsed into one enum so the router is a
//! single `match` and every endpoint's auth class is decided in one place.

use crate::server::error::ApiError;
use gw_jobapi::types::Role;

/// One endpoint, with the ids taken from its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    Submit,
    ListJobs,
    GetJob(&'a str),
    Events(&'a str),
    Cancel(&'a str),
    SetGlobalBatch(&'a str),
    StepBegin(&'a str),
    StepEnd(&'a str),
    Register,
    Heartbeat(&'a str),
    IssueToken,
    RevokeToken(Role, &'a str),
}

/// Who must sign a request (see `access.rs` for who passes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth<'a> {
    /// Issuing and revoking tokens: the admin token alone.
    Admin,
    /// Jobs: a submit token or the admin token.
    Submit,
    /// A node agent's calls: that node's token or the admin token. `None`
    /// when the node is named in the body (register), checked once decoded.
    Node(Option<&'a str>),
    /// The worker token of this job.
    Job(&'a str),
}

impl Route<'_> {
    pub fn auth(&self) -> Auth<'_> {
        match self {
            Route::StepBegin(id) | Route::StepEnd(id) => Auth::Job(id),
            Route::Submit
            | Route::ListJobs
            | Route::GetJob(_)
            | Route::Events(_)
            | Route::Cancel(_)
            | Route::SetGlobalBatch(_) => Auth::Submit,
            Route::Register => Auth::Node(None),
            Route::Heartbeat(node) => Auth::Node(Some(node)),
            Route::IssueToken | Route::RevokeToken(..) => Auth::Admin,
        }
    }
}

/// Parses `method` and `url` (query string ignored): 404 for an unknown
/// path, 405 for a known path with another method.
pub fn parse<'a>(method: &str, url: &'a str) -> Result<Route<'a>, ApiError> {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (route, want) = match segs.as_slice() {
        ["v1", "jobs"] if method == "GET" => (Route::ListJobs, "GET"),
        ["v1", "jobs"] => (Route::Submit, "POST"),
        ["v1", "jobs", id] => (Route::GetJob(id), "GET"),
        ["v1", "jobs", id, "events"] => (Route::Events(id), "GET"),
        ["v1", "jobs", id, "cancel"] => (Route::Cancel(id), "POST"),
        ["v1", "jobs", id, "global_batch"] => (Route::SetGlobalBatch(id), "POST"),
        ["v1", "jobs", id, "step", "begin"] => (Route::StepBegin(id), "POST"),
        ["v1", "jobs", id, "step", "end"] => (Route::StepEnd(id), "POST"),
        ["v1", "nodes", "register"] => (Route::Register, "POST"),
        ["v1", "nodes", node, "heartbeat"] => (Route::Heartbeat(node), "POST"),
        ["v1", "tokens"] => (Route::IssueToken, "POST"),
        ["v1", "tokens", "node", name] => (Route::RevokeToken(Role::Node, name), "DELETE"),
        ["v1", "tokens", "submit", name] => (Route::RevokeToken(Role::Submit, name), "DELETE"),
        _ => return Err(ApiError::not_found(format!("no endpoint {path}"))),
    };
    if let Route::GetJob(id)
    | Route::Events(id)
    | Route::Cancel(id)
    | Route::SetGlobalBatch(id)
    | Route::StepBegin(id)
    | Route::StepEnd(id)
    | Route::Heartbeat(id)
    | Route::RevokeToken(_, id) = &route
        && id.is_empty()
    {
        return Err(ApiError::not_found(format!("no endpoint {path}")));
    }
    if method != want {
        return Err(ApiError::new(
            405,
            format!("{path} takes {want}, not {method}"),
        ));
    }
    Ok(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint() {
        let ok = |m, u| parse(m, u).unwrap();
        assert_eq!(ok("POST", "/v1/jobs"), Route::Submit);
        assert_eq!(ok("GET", "/v1/jobs/"), Route::ListJobs);
        assert_eq!(ok("GET", "/v1/jobs/j1-ab?x=1"), Route::GetJob("j1-ab"));
        assert_eq!(ok("GET", "/v1/jobs/j1/events"), Route::Events("j1"));
        assert_eq!(ok("POST", "/v1/jobs/j1/cancel"), Route::Cancel("j1"));
        assert_eq!(
            ok("POST", "/v1/jobs/j1/global_batch"),
            Route::SetGlobalBatch("j1")
        );
        assert_eq!(ok("POST", "/v1/jobs/j1/step/begin"), Route::StepBegin("j1"));
        assert_eq!(ok("POST", "/v1/jobs/j1/step/end"), Route::StepEnd("j1"));
        assert_eq!(ok("POST", "/v1/nodes/register"), Route::Register);
        assert_eq!(ok("POST", "/v1/nodes/n1/heartbeat"), Route::Heartbeat("n1"));
        assert_eq!(ok("POST", "/v1/tokens"), Route::IssueToken);
        assert_eq!(
            ok("DELETE", "/v1/tokens/node/n1"),
            Route::RevokeToken(Role::Node, "n1")
        );
        assert_eq!(
            ok("DELETE", "/v1/tokens/submit/ci"),
            Route::RevokeToken(Role::Submit, "ci")
        );
        assert_eq!(Route::StepEnd("j1").auth(), Auth::Job("j1"));
        assert_eq!(Route::Cancel("j1").auth(), Auth::Submit);
        assert_eq!(Route::Register.auth(), Auth::Node(None));
        assert_eq!(Route::Heartbeat("n1").auth(), Auth::Node(Some("n1")));
        assert_eq!(Route::IssueToken.auth(), Auth::Admin);
    }

    #[test]
    fn unknown_paths_and_methods() {
        let status = |m, u| parse(m, u).map(|_| 200).unwrap_or_else(|e| e.status);
        assert_eq!(status("GET", "/"), 404);
        assert_eq!(status("GET", "/v2/jobs"), 404);
        assert_eq!(status("GET", "/v1/jobs//cancel"), 404);
        assert_eq!(status("GET", "/v1/jobs/j1/cancel"), 405);
        assert_eq!(status("DELETE", "/v1/jobs"), 405);
        assert_eq!(status("POST", "/v1/jobs/j1"), 405);
        assert_eq!(status("GET", "/v1/nodes/register"), 405);
        assert_eq!(status("DELETE", "/v1/tokens/admin/x"), 404);
        assert_eq!(status("DELETE", "/v1/tokens/node/"), 404);
        assert_eq!(status("GET", "/v1/tokens/node/n1"), 405);
    }
}
