//! One request, in the order that keeps an anonymous client cheap: route
//! and token first (from the head alone), then the body — bounded in size
//! and time — and only then the handler. A request refused at the first
//! step never has its body read; hyper then closes the connection.

use super::Limits;
use crate::server::app::{App, Call};
use crate::server::error::{ApiError, ApiResult};
use gw_jobapi::types::ErrorBody;
use gw_rendezvous::ratelimit::{RateLimited, suppressed};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Refused tokens are logged with the peer, but at most one line a second:
/// a client guessing tokens must not fill the operator's log.
static REFUSED: Mutex<RateLimited> = Mutex::new(RateLimited::new(Duration::from_secs(1)));

/// The parts of a request head the handlers use, owned so they can move
/// to the blocking pool.
#[derive(Clone)]
struct Head {
    method: String,
    url: String,
    authorization: Option<String>,
    host: Option<String>,
}

impl Head {
    fn call<'a>(&'a self, body: &'a [u8]) -> Call<'a> {
        Call {
            method: &self.method,
            url: &self.url,
            authorization: self.authorization.as_deref(),
            host: self.host.as_deref(),
            body,
        }
    }
}

fn text(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// hyper's service function: never fails, every error becomes a JSON reply.
pub async fn handle(
    app: Arc<App>,
    limits: Arc<Limits>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let head = Head {
        method: parts.method.as_str().to_owned(),
        url: parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned(),
        authorization: text(&parts.headers, header::AUTHORIZATION),
        host: text(&parts.headers, header::HOST),
    };
    let result = run(app, &limits, head.clone(), &parts.headers, body).await;
    Ok(reply(peer, &head, result))
}

async fn run(
    app: Arc<App>,
    limits: &Limits,
    head: Head,
    headers: &HeaderMap,
    body: Incoming,
) -> ApiResult<String> {
    let admitted = head.clone();
    blocking(app.clone(), move |app| app.admit(&admitted.call(&[]))).await?;
    let too_large = || ApiError::new(413, format!("body larger than {} bytes", limits.max_body));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large());
    }
    let collected = tokio::time::timeout(
        limits.body_timeout,
        Limited::new(body, limits.max_body).collect(),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            408,
            format!("body not received within {:?}", limits.body_timeout),
        )
    })?;
    let bytes = match collected {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(too_large()),
        Err(e) => return Err(ApiError::bad_request(format!("cannot read body: {e}"))),
    };
    blocking(app, move |app| app.handle(&head.call(&bytes))).await
}

/// Runs a handler on the blocking pool (they hold SQLite transactions).
async fn blocking<T: Send + 'static>(
    app: Arc<App>,
    f: impl FnOnce(&App) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(move || f(&app))
        .await
        .map_err(|e| ApiError::internal(format!("request handler failed: {e}")))?
}

fn reply(peer: SocketAddr, head: &Head, result: ApiResult<String>) -> Response<Full<Bytes>> {
    let (status, text) = match result {
        Ok(json) => (200, json),
        Err(e) => {
            let (method, path) = (&head.method, head.url.split('?').next().unwrap_or(""));
            // A 403 is a real token used beyond its role: as worth a line
            // as a wrong token.
            if e.status == 401 || e.status == 403 {
                let mut limit = REFUSED.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = limit.admit() {
                    tracing::warn!(
                        "{} for {peer}: {method} {path}: {}{}",
                        e.status,
                        e.message,
                        suppressed(n)
                    );
                }
            } else if e.status >= 500 {
                tracing::error!("{} for {peer}: {method} {path}: {}", e.status, e.message);
            }
            let body = serde_json::to_string(&ErrorBody { error: e.message })
                .unwrap_or_else(|_| String::from("{\"error\":\"unprintable error\"}"));
            (e.status, body)
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
