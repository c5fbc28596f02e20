//! `gwjob agent` command line.
//!
//! Parsed in full before anything starts, so a typo exits 2 without having
//! registered a half-configured node. The token never appears on the
//! command line (where `ps` shows it): it comes from `--token-file` (the
//! node's own token, from `gwjob node-token`) or `GW_ADMIN_TOKEN`.
//!
//! clap collects the flags ([`AgentArgs`], the `agent` subcommand of
//! [`crate::cli::command::Gwjob`]) as text; [`AgentArgs::options`] checks
//! them in a fixed order and reads the token, so that `--help` is answered
//! whatever else is wrong on the line, and a bad line is reported one
//! mistake at a time, in gwjob's words.

use clap::{Args, ValueHint};
use std::net::IpAddr;
use std::path::PathBuf;

pub const ABOUT: &str = "Run a node's agent";

/// clap would write `[OPTIONS]`; three flags are required (outside Slurm).
pub const USAGE: &str = "gwjob agent --server URL --node NAME --slots N [OPTIONS]";

pub const AFTER_HELP: &str = "\
Runs on each node: registers it with the job server, heartbeats, opens the
rendezvous store of jobs whose rank 0 runs here, starts the job's workers
with the GW_* variables, and reports how they exit.

Workers run in their own process groups and die with the agent. SIGINT or
SIGTERM stops them (SIGKILL after 5 s) and exits. A server that is down does
not stop running workers: the agent retries with backoff and registers
again when the server no longer knows the node.

Under Slurm (srun --ntasks-per-node=1 --exclusive gwjob agent --server URL
...) --node, --slots and --device-type default to Slurm's view of the node:
SLURMD_NODENAME, and the job's GPUs there (SLURM_JOB_GPUS, type gpu) or else
its CPUs there (SLURM_JOB_CPUS_PER_NODE, or SLURM_CPUS_ON_NODE).

Give each agent its own node token (gwjob node-token --node NAME --out FILE,
then --token-file FILE): it lets the agent act as that node only. An agent
given the admin token works, but whoever controls the node then controls
every node.";

/// Where the token comes from when `--token-file` is absent.
pub const TOKEN_ENV: &str = "GW_ADMIN_TOKEN";

/// `gwjob agent`'s flags as typed.
#[derive(Args, Clone, Debug)]
pub struct AgentArgs {
    /// The job server, e.g. http://10.0.0.1:7070 (required)
    #[arg(long, value_name = "URL", allow_hyphen_values = true, value_hint = ValueHint::Url)]
    server: Option<String>,

    /// This node's name, unique in the cluster (required; letters, digits,
    /// '.', '_', '-')
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    node: Option<String>,

    /// How many workers this node runs at once (required)
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    slots: Option<String>,

    /// The node's rack (default: default)
    #[arg(long, value_name = "RACK", allow_hyphen_values = true)]
    rack: Option<String>,

    /// The node's device type, e.g. cpu, a100 (default: cpu)
    #[arg(long = "device-type", value_name = "TYPE", allow_hyphen_values = true)]
    device_type: Option<String>,

    /// Address other nodes' workers reach this node on (default: the local
    /// address of the route to the server)
    #[arg(long, value_name = "IP", allow_hyphen_values = true)]
    addr: Option<String>,

    /// File holding this node's token, from `gwjob node-token` (default:
    /// $GW_ADMIN_TOKEN, which works but gives the agent admin rights)
    #[arg(
        long = "token-file",
        value_name = "PATH",
        allow_hyphen_values = true,
        value_hint = ValueHint::FilePath
    )]
    token_file: Option<PathBuf>,
}

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

/// A variable lookup: the process environment, or a map in tests.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What Slurm tells a task about the node it runs on, so that a site can
/// start one agent per node of an allocation
/// (`srun --ntasks-per-node=1 --exclusive gwjob agent --server URL ...`)
/// and let each describe its node as Slurm sees it: the node's name
/// (`SLURMD_NODENAME`), and as slots the GPUs the job holds there
/// (`SLURM_JOB_GPUS`, device type `gpu`) or else its CPUs there
/// ([`job_cpus_here`], or `SLURM_CPUS_ON_NODE`). A flag given on the line
/// wins.
#[derive(Debug, Default, PartialEq)]
struct SlurmNode {
    name: Option<String>,
    slots: Option<u32>,
    device_type: Option<String>,
}

impl SlurmNode {
    fn from_lookup(env: Lookup<'_>) -> Result<SlurmNode, String> {
        let set = |k: &str| {
            env(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut node = SlurmNode {
            name: set("SLURMD_NODENAME"),
            ..SlurmNode::default()
        };
        if let Some(gpus) = set("SLURM_JOB_GPUS") {
            // GPU indices, e.g. "0,1,3".
            let n = gpus.split(',').filter(|g| !g.trim().is_empty()).count();
            node.slots = u32::try_from(n).ok().filter(|&n| n > 0);
            node.device_type = node.slots.map(|_| "gpu".to_owned());
        }
        if node.slots.is_none() {
            node.slots = job_cpus_here(env, node.name.as_deref())?;
        }
        if node.slots.is_none()
            && let Some(cpus) = set("SLURM_CPUS_ON_NODE")
        {
            node.slots = Some(match cpus.parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(format!(
                        "SLURM_CPUS_ON_NODE={cpus:?} is not a positive number"
                    ));
                }
            });
        }
        Ok(node)
    }
}

/// The job's CPUs on node `name`: its entry in `SLURM_JOB_CPUS_PER_NODE`
/// (`2(x3),1`) at the node's place in `SLURM_JOB_NODELIST`. Not
/// `SLURM_CPUS_ON_NODE`, which in a step srun started is the step's share
/// (one CPU for one task), where the agent's workers may use all the job's.
fn job_cpus_here(env: Lookup<'_>, name: Option<&str>) -> Result<Option<u32>, String> {
    use gw_rendezvous::slurm::{expand_hostlist, expand_tasks_per_node};
    let (Some(name), Some(nodes), Some(cpus)) = (
        name,
        env("SLURM_JOB_NODELIST"),
        env("SLURM_JOB_CPUS_PER_NODE"),
    ) else {
        return Ok(None);
    };
    let nodes = expand_hostlist(&nodes).map_err(|e| format!("SLURM_JOB_NODELIST: {e}"))?;
    let cpus = expand_tasks_per_node(&cpus).map_err(|e| format!("SLURM_JOB_CPUS_PER_NODE: {e}"))?;
    Ok(nodes
        .iter()
        .position(|n| n == name)
        .and_then(|i| cpus.get(i).copied())
        .filter(|&n| n > 0))
}

impl AgentArgs {
    /// The agent's settings; `env_token` is `$GW_ADMIN_TOKEN`. Under Slurm
    /// the node's name, slots and device type default to Slurm's view.
    pub fn options(self, env_token: Option<String>) -> Result<Options, String> {
        self.options_in(env_token, &|k| std::env::var(k).ok())
    }

    fn options_in(self, env_token: Option<String>, env: Lookup<'_>) -> Result<Options, String> {
        let slurm = SlurmNode::from_lookup(env)?;
        let server = self.server.ok_or("--server URL is required")?;
        let server = server.trim_end_matches('/').to_owned();
        if !server.starts_with("http://") || server.len() <= "http://".len() {
            return Err(format!(
                "--server: '{server}' is not an http:// URL (e.g. http://10.0.0.1:7070)"
            ));
        }
        let node = self
            .node
            .or(slurm.name)
            .ok_or("--node NAME is required (srun sets it from SLURMD_NODENAME)")?;
        check_name("--node", &node)?;
        let rack = self.rack.unwrap_or_else(|| "default".into());
        check_name("--rack", &rack)?;
        let device_type = self
            .device_type
            .or(slurm.device_type)
            .unwrap_or_else(|| "cpu".into());
        check_name("--device-type", &device_type)?;
        let slots = match (self.slots, slurm.slots) {
            (Some(slots), _) => match slots.parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => return Err(format!("--slots: '{slots}' is not a positive number")),
            },
            (None, Some(n)) => n,
            (None, None) => {
                return Err(
                    "--slots N is required (srun sets it from SLURM_JOB_GPUS or SLURM_CPUS_ON_NODE)"
                        .into(),
                );
            }
        };
        let addr = match self.addr {
            None => None,
            Some(a) => Some(
                a.parse::<IpAddr>()
                    .map_err(|_| format!("--addr: '{a}' is not an IP address"))?,
            ),
        };
        let token = match self.token_file {
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
                        "no token: pass --token-file PATH (this node's token, from gwjob node-token) or set {TOKEN_ENV}"
                    ));
                }
            },
        };
        Ok(Options {
            server,
            node,
            rack,
            slots,
            device_type,
            addr,
            token,
        })
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
    use crate::cli::command::{Gwjob, parse};

    fn p(s: &str, env_token: Option<String>) -> Result<Gwjob, String> {
        let args = std::iter::once("agent")
            .chain(s.split_whitespace())
            .map(Into::into);
        parse(args, env_token).map_err(|e| {
            assert_eq!(e.command, "gwjob agent");
            e.message
        })
    }

    fn run(s: &str, env_token: Option<String>) -> Result<Options, String> {
        match p(s, env_token)? {
            Gwjob::Agent(o) => Ok(o),
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn full_command_line() {
        let got = run(
            "--server http://h:7070/ --node n1 --rack=r2 --slots 4 --device-type a100 --addr 10.1.2.3",
            Some("tok\n".into()),
        );
        assert_eq!(
            got,
            Ok(Options {
                server: "http://h:7070".into(),
                node: "n1".into(),
                rack: "r2".into(),
                slots: 4,
                device_type: "a100".into(),
                addr: Some("10.1.2.3".parse().unwrap()),
                token: "tok".into(),
            })
        );
    }

    #[test]
    fn defaults_and_help() {
        let o =
            run("--server http://h:1 --node a --slots 1", Some("t".into())).expect("should parse");
        assert_eq!(
            (o.rack.as_str(), o.device_type.as_str(), o.addr),
            ("default", "cpu", None)
        );
        // Help wins over what is missing or wrong on the line.
        for line in ["--node a -h", "--slots x --help", "-h --node a/b"] {
            match p(line, None) {
                Ok(Gwjob::Print(text)) => {
                    for want in [USAGE, "--device-type <TYPE>", "retries with backoff"] {
                        assert!(text.contains(want), "{line}: lacks {want:?}: {text}");
                    }
                }
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn errors_name_the_flag() {
        let t = || Some("t".to_string());
        let e = |s: &str| run(s, t()).expect_err("a mistake");
        assert!(e("--node a --slots 1").contains("--server"));
        assert!(e("--server ftp://h --node a --slots 1").contains("http://"));
        assert!(e("--server http:// --node a --slots 1").contains("http://"));
        assert!(e("--server http://h --slots 1").contains("--node"));
        assert!(e("--server http://h --node a/b --slots 1").contains("--node"));
        assert!(e("--server http://h --node a --rack r/2 --slots 1").contains("--rack"));
        assert!(e("--server http://h --node a --device-type x:y --slots 1").contains("--device"));
        assert!(e("--server http://h --node a").contains("--slots N is required"));
        assert!(e("--server http://h --node a --slots 0").contains("--slots"));
        assert!(e("--server http://h --node a --slots x").contains("--slots"));
        assert!(e("--server http://h --node a --slots 1 --addr nope").contains("--addr"));
        assert!(e("--server http://h --node a --slots 1 --bogus").contains("--bogus"));
        assert!(e("--server http://h --node a --slots").contains("needs a value"));
        assert!(e("--server http://h --node a --slots 1 stray").contains(r#"argument "stray""#));
        let none = run("--server http://h --node a --slots 1", None).expect_err("no token");
        assert!(none.contains("GW_ADMIN_TOKEN"), "{none}");
    }

    /// As srun starts `gwjob agent --server URL` on gwnode2 of a job: the
    /// node's name and slots come from Slurm, flags on the line win.
    #[test]
    fn under_slurm_the_node_describes_itself_as_slurm_sees_it() {
        use std::collections::HashMap;
        let args = |node: Option<&str>, slots: Option<&str>, device: Option<&str>| AgentArgs {
            server: Some("http://198.18.210.1:7070".into()),
            node: node.map(Into::into),
            slots: slots.map(Into::into),
            rack: None,
            device_type: device.map(Into::into),
            addr: None,
            token_file: None,
        };
        let with = |pairs: &[(&str, &str)], a: AgentArgs| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            a.options_in(Some("t".into()), &move |k| m.get(k).cloned())
        };
        let cpu_task = [("SLURMD_NODENAME", "gwnode2"), ("SLURM_CPUS_ON_NODE", "2")];
        let o = with(&cpu_task, args(None, None, None)).expect("slurm defaults");
        assert_eq!(
            (o.node.as_str(), o.slots, o.device_type.as_str()),
            ("gwnode2", 2, "cpu")
        );
        // srun -N 3 --ntasks-per-node=1 --exclusive: the step's task has one
        // CPU, the job all of the node's (seen on a real cluster).
        let exclusive = [
            ("SLURMD_NODENAME", "gwnode2"),
            ("SLURM_CPUS_ON_NODE", "1"),
            ("SLURM_JOB_NODELIST", "gwnode[1-3]"),
            ("SLURM_JOB_CPUS_PER_NODE", "4,2(x2)"),
        ];
        let o = with(&exclusive, args(None, None, None)).expect("slurm defaults");
        assert_eq!((o.node.as_str(), o.slots), ("gwnode2", 2));
        let mut bad = exclusive.to_vec();
        bad[3] = ("SLURM_JOB_CPUS_PER_NODE", "4(x");
        let e = with(&bad, args(None, None, None)).expect_err("bad list");
        assert!(e.contains("SLURM_JOB_CPUS_PER_NODE"), "{e}");
        let gpu_task = [
            ("SLURMD_NODENAME", "gpu7"),
            ("SLURM_CPUS_ON_NODE", "64"),
            ("SLURM_JOB_GPUS", "0,1,3"),
        ];
        let o = with(&gpu_task, args(None, None, None)).expect("slurm defaults");
        assert_eq!(
            (o.node.as_str(), o.slots, o.device_type.as_str()),
            ("gpu7", 3, "gpu")
        );
        let o = with(&gpu_task, args(Some("n1"), Some("2"), Some("a100"))).expect("flags");
        assert_eq!(
            (o.node.as_str(), o.slots, o.device_type.as_str()),
            ("n1", 2, "a100")
        );
        // Outside Slurm the flags are required, and the error says where
        // Slurm would have found them.
        let e = with(&[], args(Some("n1"), None, None)).expect_err("no slots");
        assert!(
            e.contains("--slots N is required") && e.contains("SLURM_CPUS_ON_NODE"),
            "{e}"
        );
        let e = with(&[], args(None, Some("1"), None)).expect_err("no node");
        assert!(
            e.contains("--node NAME is required") && e.contains("SLURMD_NODENAME"),
            "{e}"
        );
        let e = with(&[("SLURM_CPUS_ON_NODE", "x")], args(Some("n"), None, None))
            .expect_err("bad cpus");
        assert!(e.contains("SLURM_CPUS_ON_NODE=\"x\""), "{e}");
        // A name Slurm gives is checked like a flag's.
        let e =
            with(&[("SLURMD_NODENAME", "a/b")], args(None, Some("1"), None)).expect_err("bad name");
        assert!(e.contains("--node"), "{e}");
    }

    #[test]
    fn token_file_wins_and_must_not_be_empty() {
        let d = std::env::temp_dir().join(format!("gwagent-args-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("tok");
        std::fs::write(&f, "  secret \n").unwrap();
        let a = format!(
            "--server http://h --node a --slots 1 --token-file {}",
            f.display()
        );
        let o = run(&a, Some("env".into())).expect("should parse");
        assert_eq!(o.token, "secret");
        std::fs::write(&f, "\n").unwrap();
        assert!(run(&a, None).expect_err("empty").contains("empty"));
        let a = "--server http://h --node a --slots 1 --token-file /nonexistent/x";
        assert!(
            run(a, None)
                .expect_err("missing")
                .contains("/nonexistent/x")
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
