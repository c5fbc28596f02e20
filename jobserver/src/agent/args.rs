//! `gwjob agent` command line.
//!
//! Parsed in full before anything starts, so a typo exits 2 without having
//! registered a half-configured node. The admin token never appears on the
//! command line (where `ps` shows it): it comes from `--token-file` or
//! `GW_ADMIN_TOKEN`.

use std::net::IpAddr;
use std::path::PathBuf;

pub const HELP: &str = "\
usage: gwjob agent --server URL --node NAME --slots N [options]

Runs on each node: registers it with the job server, heartbeats, opens the
rendezvous store of jobs whose rank 0 runs here, starts the job's workers
with the GW_* variables, and reports how they exit.

options:
  --server URL        the job server, e.g. http://10.0.0.1:7070 (required)
  --node NAME         this node's name, unique in the cluster (required;
                      letters, digits, '.', '_', '-')
  --slots N           how many workers this node runs at once (required)
  --rack RACK         the node's rack (default: default)
  --device-type TYPE  the node's device type, e.g. cpu, a100 (default: cpu)
  --addr IP           address other nodes' workers reach this node on
                      (default: the local address of the route to the server)
  --token-file PATH   file holding the admin token (default: $GW_ADMIN_TOKEN)
  -h, --help          this text

Workers run in their own process groups and die with the agent. SIGINT or
SIGTERM stops them (SIGKILL after 5 s) and exits. A server that is down does
not stop running workers: the agent retries with backoff and registers
again when the server no longer knows the node.
";

/// Everything `gwjob agent` needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Base URL without a trailing '/'.
    pub server: String,
    pub node: String,
    pub rack: String,
    pub slots: u32,
    pub device_type: String,
    pub addr: Option<IpAddr>,
    pub token: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Help,
    Run(Options),
}

/// Where the admin token comes from when `--token-file` is absent.
pub const TOKEN_ENV: &str = "GW_ADMIN_TOKEN";

/// Parses the arguments after `agent`; `env_token` is `$GW_ADMIN_TOKEN`.
pub fn parse(args: &[String], env_token: Option<String>) -> Result<Command, String> {
    let mut server = None;
    let mut node = None;
    let mut rack = None;
    let mut slots = None;
    let mut device_type = None;
    let mut addr = None;
    let mut token_file: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-h" || a == "--help" {
            return Ok(Command::Help);
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let slot = match flag {
            "--server" => &mut server,
            "--node" => &mut node,
            "--rack" => &mut rack,
            "--slots" => &mut slots,
            "--device-type" => &mut device_type,
            "--addr" => &mut addr,
            "--token-file" => {
                let v = value(flag, inline, &mut it)?;
                token_file = Some(PathBuf::from(v));
                continue;
            }
            _ => return Err(format!("unknown argument '{a}' (see gwjob agent --help)")),
        };
        *slot = Some(value(flag, inline, &mut it)?);
    }

    let server = server.ok_or("--server URL is required")?;
    let server = server.trim_end_matches('/').to_owned();
    if !server.starts_with("http://") || server.len() <= "http://".len() {
        return Err(format!(
            "--server: '{server}' is not an http:// URL (e.g. http://10.0.0.1:7070)"
        ));
    }
    let node = node.ok_or("--node NAME is required")?;
    check_name("--node", &node)?;
    let rack = rack.unwrap_or_else(|| "default".into());
    check_name("--rack", &rack)?;
    let device_type = device_type.unwrap_or_else(|| "cpu".into());
    check_name("--device-type", &device_type)?;
    let slots = slots.ok_or("--slots N is required")?;
    let slots = match slots.parse::<u32>() {
        Ok(n) if n > 0 => n,
        _ => return Err(format!("--slots: '{slots}' is not a positive number")),
    };
    let addr = match addr {
        None => None,
        Some(a) => Some(
            a.parse::<IpAddr>()
                .map_err(|_| format!("--addr: '{a}' is not an IP address"))?,
        ),
    };
    let token = match token_file {
        Some(p) => {
            let t = std::fs::read_to_string(&p)
                .map_err(|e| format!("--token-file {}: {e}", p.display()))?;
            let t = t.trim().to_owned();
            if t.is_empty() {
                return Err(format!("--token-file {}: the file is empty", p.display()));
            }
            t
        }
        None => match env_token.map(|t| t.trim().to_owned()) {
            Some(t) if !t.is_empty() => t,
            _ => {
                return Err(format!(
                    "no admin token: pass --token-file PATH or set {TOKEN_ENV}"
                ));
            }
        },
    };
    Ok(Command::Run(Options {
        server,
        node,
        rack,
        slots,
        device_type,
        addr,
        token,
    }))
}

fn value<'a>(
    flag: &str,
    inline: Option<String>,
    it: &mut impl Iterator<Item = &'a String>,
) -> Result<String, String> {
    match inline {
        Some(v) => Ok(v),
        None => it
            .next()
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value")),
    }
}

/// Names travel in URL paths and log lines: keep them to a safe alphabet.
fn check_name(flag: &str, v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= 128
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{flag}: '{v}' must be 1 to 128 letters, digits, '.', '_' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn full_command_line() {
        let got = parse(
            &args(
                "--server http://h:7070/ --node n1 --rack=r2 --slots 4 --device-type a100 --addr 10.1.2.3",
            ),
            Some("tok\n".into()),
        );
        assert_eq!(
            got,
            Ok(Command::Run(Options {
                server: "http://h:7070".into(),
                node: "n1".into(),
                rack: "r2".into(),
                slots: 4,
                device_type: "a100".into(),
                addr: Some("10.1.2.3".parse().unwrap()),
                token: "tok".into(),
            }))
        );
    }

    #[test]
    fn defaults_and_help() {
        let Ok(Command::Run(o)) = parse(
            &args("--server http://h:1 --node a --slots 1"),
            Some("t".into()),
        ) else {
            panic!("should parse");
        };
        assert_eq!(
            (o.rack.as_str(), o.device_type.as_str(), o.addr),
            ("default", "cpu", None)
        );
        assert_eq!(parse(&args("--node a -h"), None), Ok(Command::Help));
    }

    #[test]
    fn errors_name_the_flag() {
        let t = || Some("t".to_string());
        let e = |s: &str| parse(&args(s), t()).unwrap_err();
        assert!(e("--node a --slots 1").contains("--server"));
        assert!(e("--server ftp://h --node a --slots 1").contains("http://"));
        assert!(e("--server http://h --slots 1").contains("--node"));
        assert!(e("--server http://h --node a/b --slots 1").contains("--node"));
        assert!(e("--server http://h --node a --slots 0").contains("--slots"));
        assert!(e("--server http://h --node a --slots x").contains("--slots"));
        assert!(e("--server http://h --node a --slots 1 --addr nope").contains("--addr"));
        assert!(e("--server http://h --node a --slots 1 --bogus").contains("--bogus"));
        assert!(e("--server http://h --node a --slots").contains("needs a value"));
        let none = parse(&args("--server http://h --node a --slots 1"), None).unwrap_err();
        assert!(none.contains("GW_ADMIN_TOKEN"), "{none}");
    }

    #[test]
    fn token_file_wins_and_must_not_be_empty() {
        let d = std::env::temp_dir().join(format!("gwagent-args-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("tok");
        std::fs::write(&f, "  secret \n").unwrap();
        let a = args(&format!(
            "--server http://h --node a --slots 1 --token-file {}",
            f.display()
        ));
        let Ok(Command::Run(o)) = parse(&a, Some("env".into())) else {
            panic!("should parse");
        };
        assert_eq!(o.token, "secret");
        std::fs::write(&f, "\n").unwrap();
        assert!(parse(&a, None).unwrap_err().contains("empty"));
        let a = args("--server http://h --node a --slots 1 --token-file /nonexistent/x");
        assert!(parse(&a, None).unwrap_err().contains("/nonexistent/x"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
