//! A private two-node Slurm cluster for one test process, brought up by
//! `scripts/slurm-cluster.sh` under names of its own (namespaces, state
//! directory) and torn down on drop, so that no failure leaves daemons or
//! namespaces behind.

use crate::{Run, collect};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Set to `required` by the test script once Slurm is installed: then a
/// cluster that cannot be brought up fails the test instead of skipping it.
pub const REQUIRE_VAR: &str = "GW_TEST_SLURM";

pub struct Cluster {
    script: PathBuf,
    /// The cluster's state directory (logs, slurm.conf, job output).
    pub dir: PathBuf,
    prefix: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

impl Cluster {
    /// Brings the cluster up, or returns `None` after a loud SKIPPED line
    /// where this machine cannot make network namespaces (a failure instead
    /// where `GW_TEST_NETNS` or [`REQUIRE_VAR`] is `required`) or has no
    /// Slurm (where [`REQUIRE_VAR`] is `required`, `up` installs it).
    pub fn up_or_skip(test: &str) -> Option<Cluster> {
        Self::up_or_skip_as(test, "")
    }

    /// As [`Cluster::up_or_skip`], for a further cluster of the same test
    /// process, told apart by `tag` (at most 2 characters: the namespaces'
    /// prefix is limited), so that cases that wait on the clock can run
    /// beside the others instead of holding their cluster's processors.
    pub fn up_or_skip_as(test: &str, tag: &str) -> Option<Cluster> {
        assert!(tag.len() <= 2, "cluster tag {tag:?} is over 2 characters");
        let id = std::process::id();
        let cluster = Cluster {
            script: repo().join("scripts/slurm-cluster.sh"),
            dir: std::env::temp_dir().join(format!("gw-slurm-{id}{tag}")),
            prefix: format!("gws{id}{tag}"),
        };
        let required = |var: &str| std::env::var(var).is_ok_and(|v| v == "required");
        // Skips unless one of `vars` says this machine can do what failed.
        let skip = |why: String, vars: &[&str]| {
            if let Some(var) = vars.iter().find(|v| required(v)) {
                panic!("{test}: {var}=required, but {why}");
            }
            println!(
                "SKIPPED {test}: {why}; set {REQUIRE_VAR}=required to make this a failure \
                 (scripts/test.sh does where it installed Slurm)"
            );
            None
        };
        if let Err(why) = crate::netns::Namespaces::create("sp", 211) {
            return skip(
                format!("network namespaces cannot be made here ({why})"),
                &[REQUIRE_VAR, crate::netns::REQUIRE_VAR],
            );
        }
        if which("slurmctld").is_none() && !required(REQUIRE_VAR) {
            return skip(
                "Slurm is not installed (scripts/slurm-cluster.sh install)".into(),
                &[REQUIRE_VAR],
            );
        }
        let up = cluster.script(&["up"], Duration::from_secs(600));
        if !up.status.success() {
            let logs = cluster.logs();
            // Dropping the cluster tears down what `up` left half made.
            drop(cluster);
            panic!(
                "{test}: scripts/slurm-cluster.sh up failed:\n{}\n{logs}",
                up.all()
            );
        }
        Some(cluster)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.script);
        c.args(args)
            .env("GW_SLURM_DIR", &self.dir)
            .env("GW_SLURM_NS", &self.prefix)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn script(&self, args: &[&str], deadline: Duration) -> Run {
        let child = self
            .command(args)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.script.display()));
        collect(
            child,
            deadline,
            &format!("slurm-cluster.sh {}", args.join(" ")),
        )
    }

    /// The command line that runs what follows it on the login node, for
    /// helpers that take a prefix (`gw_tests::jobs`).
    pub fn login_prefix(&self) -> Vec<String> {
        vec![
            "env".into(),
            format!("GW_SLURM_DIR={}", self.dir.display()),
            format!("GW_SLURM_NS={}", self.prefix),
            self.script.display().to_string(),
            "exec".into(),
        ]
    }

    /// A command to run on the login node, with `env` added to this
    /// process's environment (which srun and sbatch pass on to the job).
    pub fn login(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut all = vec!["exec"];
        all.extend_from_slice(args);
        let mut c = self.command(&all);
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    /// Runs a command on the login node, failing the test past `deadline`.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Run {
        let child = self
            .login(args, env)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", args.join(" ")));
        collect(child, deadline, &args.join(" "))
    }

    /// Runs a command on `node` (e.g. `scontrol listpids`, which asks that
    /// node's slurmd).
    pub fn on(&self, node: &str, args: &[&str]) -> Run {
        let mut all = vec!["on", node];
        all.extend_from_slice(args);
        self.script(&all, Duration::from_secs(60))
    }

    /// The ends of the daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("log")) else {
            return format!("(no logs in {})", self.dir.display());
        };
        for e in entries.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out += &format!("--- {}\n{}\n", e.path().display(), tail.join("\n"));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let down = self
            .command(&["down"])
            .spawn()
            .map(|c| collect(c, Duration::from_secs(120), "slurm-cluster.sh down"));
        match down {
            Ok(r) if r.status.success() => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Ok(r) => eprintln!("slurm-cluster.sh down failed:\n{}", r.all()),
            Err(e) => eprintln!("spawning slurm-cluster.sh down: {e}"),
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
