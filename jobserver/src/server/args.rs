//! `gwjob serve`'s command line.

use crate::cli::flags::{Flags, Item};
use std::path::PathBuf;
use std::time::Duration;

pub const HELP: &str = "\
gwjob serve - the gradwire job server

usage: gwjob serve --db PATH [--listen ADDR] [OPTIONS]

Keeps nodes, jobs, plans and step reports in the SQLite database PATH and
serves the HTTP/JSON API documented in docs/jobserver.md. Restarting on the
same database resumes every running job where it was.

options:
  --db PATH                database file (created if missing; required)
  --listen ADDR            address to serve on (default 127.0.0.1:7070;
                           port 0 picks a free one)
  --admin-token-file PATH  file holding the admin token (else GW_ADMIN_TOKEN,
                           else <db dir>/admin.token, created on first start)
  --node-timeout SECS      a node silent this long is lost (default 10)
  --heartbeat-ms MS        heartbeat interval agents are told (default: a
                           quarter of the node timeout, at most 1000)
  --advertise URL          URL given to workers as GW_JOB_SERVER (default:
                           the URL the agent used to reach this server)
  --threads N              HTTP worker threads (default 4)
  -h, --help               print this help
On start it prints 'gwjob: listening on http://HOST:PORT'.
";

#[derive(Clone, Debug, PartialEq)]
pub struct ServeOptions {
    pub db: PathBuf,
    pub listen: String,
    pub token_file: Option<PathBuf>,
    pub node_timeout: Duration,
    pub heartbeat_ms: u64,
    pub advertise: Option<String>,
    pub threads: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Serve {
    Help,
    Run(ServeOptions),
}

pub fn parse(args: Vec<String>) -> Result<Serve, String> {
    let mut f = Flags::new(args);
    let mut db = None;
    let mut listen = String::from("127.0.0.1:7070");
    let mut token_file = None;
    let mut timeout: f64 = 10.0;
    let mut heartbeat_ms = None;
    let mut advertise = None;
    let mut threads: usize = 4;
    while let Some(item) = f.next_item() {
        let (name, inline) = match item {
            Item::Flag(n, v) => (n, v),
            Item::Positional(p) => return Err(format!("unexpected argument {p:?}")),
            Item::End => return Err("unexpected '--'".into()),
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Serve::Help),
            "--db" => db = Some(PathBuf::from(f.value(&name, inline)?)),
            "--listen" => listen = f.value(&name, inline)?,
            "--admin-token-file" => token_file = Some(PathBuf::from(f.value(&name, inline)?)),
            "--node-timeout" => timeout = f.number(&name, inline)?,
            "--heartbeat-ms" => heartbeat_ms = Some(f.number::<u64>(&name, inline)?),
            "--advertise" => advertise = Some(f.value(&name, inline)?),
            "--threads" => threads = f.number(&name, inline)?,
            _ => return Err(format!("unknown option {name}")),
        }
    }
    let db = db.ok_or("--db PATH is required")?;
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 86_400.0) {
        return Err(format!(
            "--node-timeout must be a positive number of seconds (got {timeout})"
        ));
    }
    let node_timeout = Duration::from_secs_f64(timeout);
    let default_hb = (node_timeout.as_millis() / 4).clamp(1, 1000) as u64;
    let heartbeat_ms = heartbeat_ms.unwrap_or(default_hb);
    if heartbeat_ms == 0 || u128::from(heartbeat_ms) >= node_timeout.as_millis() {
        return Err(format!(
            "--heartbeat-ms {heartbeat_ms} must be positive and below the node timeout"
        ));
    }
    if !(1..=64).contains(&threads) {
        return Err(format!("--threads must be 1..=64 (got {threads})"));
    }
    if let Some(a) = &advertise
        && !(a.starts_with("http://") || a.starts_with("https://"))
    {
        return Err(format!("--advertise {a:?} must be an http:// URL"));
    }
    Ok(Serve::Run(ServeOptions {
        db,
        listen,
        token_file,
        node_timeout,
        heartbeat_ms,
        advertise,
        threads,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Serve, String> {
        parse(a.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn defaults_and_options() {
        let Ok(Serve::Run(o)) = p(&["--db", "x.db"]) else {
            panic!()
        };
        assert_eq!(o.listen, "127.0.0.1:7070");
        assert_eq!(o.node_timeout, Duration::from_secs(10));
        assert_eq!(o.heartbeat_ms, 1000);
        let Ok(Serve::Run(o)) = p(&[
            "--db=x.db",
            "--listen",
            "127.0.0.1:0",
            "--node-timeout",
            "0.4",
            "--advertise",
            "http://h:1",
        ]) else {
            panic!()
        };
        assert_eq!(o.heartbeat_ms, 100);
        assert_eq!(o.advertise.as_deref(), Some("http://h:1"));
        assert_eq!(p(&["--help"]), Ok(Serve::Help));
    }

    #[test]
    fn mistakes() {
        for (a, want) in [
            (&["--listen", "x"][..], "--db PATH is required"),
            (&["--db", "x", "--node-timeout", "0"][..], "--node-timeout"),
            (&["--db", "x", "--node-timeout", "s"][..], "needs a number"),
            (&["--db", "x", "--frob"][..], "unknown option --frob"),
            (&["--db", "x", "extra"][..], "unexpected argument"),
            (
                &["--db", "x", "--heartbeat-ms", "20000"][..],
                "--heartbeat-ms",
            ),
            (&["--db", "x", "--advertise", "h:1"][..], "http://"),
            (&["--db"][..], "needs a value"),
        ] {
            let e = p(a).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
