//! One JSON-over-HTTP call with a bearer token, shared by every client of the
//! job server (agents, `gwjob`, workers), so errors read the same everywhere.

use crate::types::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Why a call to the job server failed.
#[derive(Debug)]
pub enum HttpError {
    /// The server could not be reached or the connection broke: worth retrying.
    Transport { url: String, detail: String },
    /// The server answered with an error status and message: not retried
    /// unless the status is 5xx.
    Status {
        url: String,
        status: u16,
        message: String,
    },
    /// The reply was not the JSON we expected.
    Decode { url: String, detail: String },
}

impl HttpError {
    /// Whether trying again later can help (server down, restarting, or 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            HttpError::Transport { .. } => true,
            HttpError::Status { status, .. } => *status >= 500,
            HttpError::Decode { .. } => false,
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Transport { url, detail } => write!(f, "{url}: {detail}"),
            HttpError::Status {
                url,
                status,
                message,
            } => write!(f, "{url}: HTTP {status}: {message}"),
            HttpError::Decode { url, detail } => write!(f, "{url}: bad reply: {detail}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// A client of the job server that keeps its connection between calls
/// (HTTP keep-alive): a worker's two calls per step, or an agent's
/// heartbeats, then cost no new TCP handshake, and the server no new
/// connection each.
#[derive(Clone, Debug)]
pub struct Client {
    agent: ureq::Agent,
}

impl Client {
    /// A client whose every call gives up after `timeout`.
    pub fn new(timeout: Duration) -> Client {
        Client {
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
        }
    }

    /// Sends `body` (or nothing, for GET) to `base` + `path` and decodes
    /// the reply.
    pub fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        base: &str,
        path: &str,
        token: &str,
        body: Option<&B>,
    ) -> Result<R, HttpError> {
        let url = format!("{}{}", base.trim_end_matches('/'), path);
        let req = self
            .agent
            .request(method, &url)
            .set("Authorization", &format!("Bearer {token}"));
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        decode(url, res)
    }
}

/// One call on a connection of its own (for one-off callers such as the
/// `gwjob` command line).
pub fn call<B: Serialize, R: DeserializeOwned>(
    method: &str,
    base: &str,
    path: &str,
    token: &str,
    body: Option<&B>,
    timeout: Duration,
) -> Result<R, HttpError> {
    Client::new(timeout).call(method, base, path, token, body)
}

fn decode<R: DeserializeOwned>(
    url: String,
    res: Result<ureq::Response, ureq::Error>,
) -> Result<R, HttpError> {
    match res {
        Ok(r) => r.into_json::<R>().map_err(|e| HttpError::Decode {
            url,
            detail: e.to_string(),
        }),
        Err(ureq::Error::Status(status, r)) => {
            let text = r.into_string().unwrap_or_default();
            let message = serde_json::from_str::<ErrorBody>(&text)
                .map(|e| e.error)
                .unwrap_or(text);
            Err(HttpError::Status {
                url,
                status,
                message,
            })
        }
        Err(ureq::Error::Transport(t)) => {
            // Transport's Display repeats the URL, which ours already names.
            let detail = match t.message() {
                Some(m) => format!("{}: {m}", t.kind()),
                None => t.kind().to_string(),
            };
            Err(HttpError::Transport { url, detail })
        }
    }
}
