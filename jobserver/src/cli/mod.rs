//! `gwjob submit|status|cancel`: the operator's client of the job server.
//! It only turns a command line into one or two API calls and the reply
//! into text; all policy lives in the server.

pub mod args;
pub mod flags;
pub mod table;

use crate::server::auth::read_token;
use crate::server::status::EventLine;
use args::{Cli, Conn};
use gw_jobapi::http::call;
use gw_jobapi::types::{JobStatus, SubmitReply};
use std::time::Duration;

/// Default server when neither `--server` nor `GW_JOB_SERVER_URL` is given.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";
const TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `gwjob CMD ARGS` for CMD in submit, status, cancel; returns the exit
/// status (0 ok, 1 the server refused or could not be reached, 2 usage).
pub fn main(cmd: &str, args: Vec<String>) -> i32 {
    let cli = match args::parse(cmd, args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gwjob {cmd}: error: {e}\n(see 'gwjob {cmd} --help')");
            return 2;
        }
    };
    match run(cli) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("gwjob {cmd}: {e}");
            1
        }
    }
}

/// The server URL and admin token for `conn`.
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
            .ok_or("no admin token: give --token-file PATH or set GW_ADMIN_TOKEN")?,
    };
    Ok((server, token))
}

fn run(cli: Cli) -> Result<String, String> {
    match cli {
        Cli::Help => Ok(args::HELP.to_owned()),
        Cli::Submit(conn, req) => {
            let (server, token) = connect(&conn)?;
            let r: SubmitReply = call("POST", &server, "/v1/jobs", &token, Some(&req), TIMEOUT)
                .map_err(|e| e.to_string())?;
            Ok(format!("{}\n", r.job_id))
        }
        Cli::Status { conn, job, json } => {
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
        Cli::Cancel(conn, id) => {
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
    }
}
