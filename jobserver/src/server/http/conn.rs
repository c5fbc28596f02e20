//! One client connection: hyper's HTTP/1.1 state machine under the head
//! deadline and size limits, plus a watchdog that closes the connection
//! when nothing has moved for [`Limits::stall_timeout`] (an idle keep-alive
//! connection, or a client that stopped reading).

use super::Limits;
use super::request;
use super::watched::{Progress, Watched};
use crate::server::app::App;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// hyper refuses a read buffer smaller than this.
const MIN_BUF: usize = 8192;

/// Serves `stream` until the client closes it or a limit does.
pub async fn serve(app: Arc<App>, limits: Arc<Limits>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let progress = Progress::new();
    let io = TokioIo::new(Watched::new(stream, progress.clone()));
    let service_limits = limits.clone();
    let service =
        service_fn(move |req| request::handle(app.clone(), service_limits.clone(), peer, req));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF))
        .max_headers(limits.max_headers)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let tick = (limits.stall_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection from {peer} ended: {e}");
                }
                return;
            }
            () = tokio::time::sleep(tick) => {
                if progress.quiet_for() >= limits.stall_timeout {
                    tracing::debug!(
                        "closing the connection from {peer}: nothing moved for {:?}",
                        limits.stall_timeout
                    );
                    return;
                }
            }
        }
    }
}

/// Turns away a connection over a cap: a best-effort 503 (the clients
/// retry those) without waiting on the peer, then close.
pub fn refuse(stream: TcpStream) {
    const BODY: &str = "{\"error\":\"too many connections; retry later\"}";
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(reply.as_bytes());
}
