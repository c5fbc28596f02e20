//! The HTTP side: a few threads take requests from tiny_http, hand their
//! parts to [`App::handle`], and write the JSON reply. Refused tokens are
//! logged here, where the peer address is known.

use crate::server::app::{App, Call};
use crate::server::error::ApiError;
use gw_jobapi::types::ErrorBody;
use std::io::Read;
use std::sync::Arc;
use tiny_http::{Header, Request, Response, Server};

/// Largest request body accepted; real ones are a few hundred bytes.
pub const MAX_BODY: usize = 1 << 20;

/// Serves requests on `threads` threads (this one included) until the
/// process ends.
pub fn serve(app: Arc<App>, server: Arc<Server>, threads: usize) {
    let mut handles = Vec::new();
    for i in 1..threads.max(1) {
        let (app, server) = (app.clone(), server.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("gwjob-http-{i}"))
            .spawn(move || worker(&app, &server));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => tracing::error!("cannot start HTTP thread {i}: {e}"),
        }
    }
    worker(&app, &server);
    for h in handles {
        let _ = h.join();
    }
}

fn worker(app: &App, server: &Server) {
    loop {
        match server.recv() {
            Ok(req) => serve_one(app, req),
            Err(e) => {
                tracing::error!("accepting a request failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

fn read_body(req: &mut Request) -> Result<Vec<u8>, ApiError> {
    if req.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(ApiError::new(
            413,
            format!("body larger than {MAX_BODY} bytes"),
        ));
    }
    let mut buf = Vec::new();
    req.as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| ApiError::bad_request(format!("cannot read body: {e}")))?;
    if buf.len() > MAX_BODY {
        return Err(ApiError::new(
            413,
            format!("body larger than {MAX_BODY} bytes"),
        ));
    }
    Ok(buf)
}

fn serve_one(app: &App, mut req: Request) {
    let method = req.method().as_str().to_owned();
    let url = req.url().to_owned();
    let peer = req
        .remote_addr()
        .map_or_else(|| "unknown peer".to_owned(), ToString::to_string);
    let result = read_body(&mut req).and_then(|body| {
        app.handle(&Call {
            method: &method,
            url: &url,
            authorization: header(&req, "Authorization"),
            host: header(&req, "Host"),
            body: &body,
        })
    });
    let (status, text) = match result {
        Ok(json) => (200, json),
        Err(e) => {
            let path = url.split('?').next().unwrap_or("");
            if e.status == 401 {
                tracing::warn!("401 for {peer}: {method} {path}: {}", e.message);
            } else if e.status >= 500 {
                tracing::error!("{} for {peer}: {method} {path}: {}", e.status, e.message);
            }
            let body = serde_json::to_string(&ErrorBody { error: e.message })
                .unwrap_or_else(|_| String::from("{\"error\":\"unprintable error\"}"));
            (e.status, body)
        }
    };
    let mut resp = Response::from_string(text).with_status_code(status);
    if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
        resp = resp.with_header(h);
    }
    if let Err(e) = req.respond(resp) {
        tracing::warn!("cannot reply to {peer}: {e}");
    }
}
