//! `gwjob submit|status|cancel|node-token|token`: the operator's client of
//! the job server. It only turns a command line into one or two API calls
//! and the reply into text; all policy lives in the server. `gwjob
//! simulate|gen-trace` ([`sim`]) run the scheduler offline.
//!
//! [`command`] is the whole of gwjob's command line (the server's and the
//! agent's subcommands too), [`args`] and [`token_args`] the client
//! commands' part of it and [`flags`] what the subcommands' definitions
//! share. Nothing here prints:
//! the binary prints what [`run`] returns, or its error.

pub mod args;
pub mod command;
pub mod flags;
pub mod sim;
pub mod sim_args;
pub mod table;
pub mod token_args;

use crate::server::auth::read_token;
use crate::server::status::EventLine;
use args::{Client, Conn};
use gw_jobapi::http::call;
use gw_jobapi::types::{IssueToken, IssuedToken, JobStatus, RevokedToken, SubmitReply};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// Default server when neither `--server` nor `GW_JOB_SERVER_URL` is given.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";
const TIMEOUT: Duration = Duration::from_secs(30);

/// The server URL and token for `conn`.
fn connect(conn: &Conn) -> Result<(String, String), String> {
    let server = conn
        .server
        .clone()
        .or_else(|| {
            std::env::var("GW_JOB_SERVER_URL")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
    let token = match &conn.token_file {
        Some(p) => read_token(p)?,
        None => std::env::var("GW_ADMIN_TOKEN")
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .ok_or("no token: give --token-file PATH or set GW_ADMIN_TOKEN")?,
    };
    Ok((server, token))
}

/// Sends `client`'s request; returns the text to print on stdout (exit 0),
/// or the one-line reason it failed (the server refused, or could not be
/// reached: exit 1).
pub fn run(client: Client) -> Result<String, String> {
    match client {
        Client::Simulate(s) => sim::run_simulate(&s),
        Client::GenTrace(g) => sim::run_gen_trace(&g),
        Client::Submit(conn, req) => {
            let (server, token) = connect(&conn)?;
            let r: SubmitReply = call("POST", &server, "/v1/jobs", &token, Some(&req), TIMEOUT)
                .map_err(|e| e.to_string())?;
            Ok(format!("{}\n", r.job_id))
        }
        Client::Status { conn, job, json } => {
            let (server, token) = connect(&conn)?;
            let get = |path: &str| {
                call::<(), serde_json::Value>("GET", &server, path, &token, None, TIMEOUT)
            };
            match job {
                None => {
                    let v = get("/v1/jobs").map_err(|e| e.to_string())?;
                    if json {
                        return Ok(format!("{v:#}\n"));
                    }
                    let list: Vec<JobStatus> =
                        serde_json::from_value(v).map_err(|e| format!("bad reply: {e}"))?;
                    Ok(table::jobs(&list))
                }
                Some(id) => {
                    let v = get(&format!("/v1/jobs/{id}")).map_err(|e| e.to_string())?;
                    if json {
                        return Ok(format!("{v:#}\n"));
                    }
                    let st: JobStatus =
                        serde_json::from_value(v).map_err(|e| format!("bad reply: {e}"))?;
                    // Events are a nicety: a failure to fetch them is not an error.
                    let events: Vec<EventLine> = get(&format!("/v1/jobs/{id}/events"))
                        .ok()
                        .and_then(|v| serde_json::from_value(v).ok())
                        .unwrap_or_default();
                    Ok(table::job(&st, &events))
                }
            }
        }
        Client::Cancel(conn, id) => {
            let (server, token) = connect(&conn)?;
            let st: JobStatus = call::<(), _>(
                "POST",
                &server,
                &format!("/v1/jobs/{id}/cancel"),
                &token,
                None,
                TIMEOUT,
            )
            .map_err(|e| e.to_string())?;
            Ok(format!("job {} {}\n", st.job_id, table::state(st.state)))
        }
        Client::Issue {
            conn,
            role,
            name,
            out,
        } => {
            let (server, token) = connect(&conn)?;
            // The file first: a path that cannot be created must not cost
            // the node its current token.
            let file = out.as_deref().map(create_private).transpose()?;
            let req = IssueToken { role, name };
            let issued: Result<IssuedToken, _> =
                call("POST", &server, "/v1/tokens", &token, Some(&req), TIMEOUT);
            match (issued, file) {
                (Ok(r), None) => Ok(format!("{}\n", r.token)),
                (Ok(r), Some((mut f, path))) => {
                    writeln!(f, "{}", r.token)
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    Ok(format!(
                        "{} token for {} written to {}\n",
                        r.role.as_str(),
                        r.name,
                        path.display()
                    ))
                }
                (Err(e), file) => {
                    if let Some((_, path)) = file {
                        let _ = std::fs::remove_file(path);
                    }
                    Err(e.to_string())
                }
            }
        }
        Client::Revoke { conn, role, name } => {
            let (server, token) = connect(&conn)?;
            let path = format!("/v1/tokens/{}/{name}", role.as_str());
            let r: RevokedToken = call::<(), _>("DELETE", &server, &path, &token, None, TIMEOUT)
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "{} token for {} revoked\n",
                r.role.as_str(),
                r.name
            ))
        }
    }
}

/// A new file only its owner can read, for a token: printed to a terminal
/// or redirected through a shell's umask, it could end up readable.
fn create_private(path: &Path) -> Result<(std::fs::File, &Path), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map(|f| (f, path))
        .map_err(|e| format!("cannot create {}: {e}", path.display()))
}
