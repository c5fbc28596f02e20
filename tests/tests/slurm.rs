//! gradwire under a real Slurm: a two-node cluster (scripts/slurm-cluster.sh,
//! each node a network namespace with its own address and host name) runs
//! the ranks through srun and sbatch as a site would, with nothing but
//! Slurm's variables and the job's GW_TOKEN to start from. Every collective
//! is checked exactly, the transport choice (shm within a node, TCP across)
//! is read from each rank's log, and the failure cases (a rank killed, the
//! step cancelled, the time limit) must end every rank within bounds.
//!
//! One test, its cases in sequence: they share a cluster, which one job at
//! a time fills. The time limit's case, which waits on Slurm's clock, runs
//! beside them on a second cluster.
//! Skipped, saying so, where namespaces or Slurm cannot be had (see
//! `gw_tests::slurm::Cluster::up_or_skip`).

use gw_tests::slurm::Cluster;
use gw_tests::{Run, bin, bin_dir, collect};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Per-rank timeout the ranks are given: detection must come well before.
const GW_TIMEOUT_S: u64 = 30;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn token() -> String {
    gw_rendezvous::token::random_hex(16).expect("reading /dev/urandom for a job token")
}

fn path_of(p: &Path) -> String {
    p.display().to_string()
}

/// The node (1-based, as in gwnode1) srun puts rank `r` of `srun -N 2 -n 4`
/// on: block distribution, two per node.
fn node_of(r: u32) -> u32 {
    r / 2 + 1
}

#[test]
fn gradwire_runs_under_a_two_node_slurm_cluster() {
    let test = "gradwire_runs_under_a_two_node_slurm_cluster";
    let Some(cluster) = Cluster::up_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let tok = token();
    let timeout = GW_TIMEOUT_S.to_string();
    let env = [("GW_TOKEN", tok.as_str()), ("GW_TIMEOUT", timeout.as_str())];
    // The time limit's case waits out Slurm's minute (and its enforcement
    // period, up to half a minute more): on a cluster of its own, with
    // ranks that mostly sleep, it runs beside the other cases instead of
    // after them.
    let Some(timed) = Cluster::up_or_skip_as(test, "t") else {
        return;
    };
    let cases: [(&str, &dyn Fn()); 8] = [
        ("allreduce", &|| srun_allreduce(&cluster, &env)),
        ("other collectives", &|| {
            srun_other_collectives(&cluster, &env)
        }),
        ("C example", &|| srun_c_example(&cluster, &env)),
        ("Python example", &|| srun_python_example(&cluster, &env)),
        ("killed rank", &|| killed_rank_is_named(&cluster, &env)),
        ("scancel", &|| cancelled_step_ends(&cluster, &env)),
        ("sbatch", &|| sbatch_runs_the_example_script(&cluster)),
        ("agents", &|| agents_started_by_srun_run_a_job(&cluster)),
    ];
    let (timings, time_limit) = std::thread::scope(|s| {
        let time_limit = s.spawn(|| {
            let t = Instant::now();
            time_limit_ends_ranks(&timed, &env);
            t.elapsed()
        });
        let mut timings = Vec::new();
        for (what, case) in cases {
            let t = Instant::now();
            case();
            timings.push(format!("{what} {:.1?}", t.elapsed()));
        }
        // A panic there is the case's failure: pass it on as it came.
        let took = time_limit
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (timings, took)
    });
    println!(
        "slurm cases took {:?}: {} (beside them, on a second cluster: time limit {time_limit:.1?})",
        started.elapsed(),
        timings.join(", ")
    );
}

/// `srun -N 2 -n 4 gwbench allreduce -c 1`, as the README shows it: every
/// size checked exactly, each rank initialised from Slurm's variables
/// (rank, local rank and local size, the store on the first node), and each
/// reaching the other rank of its node by shared memory and the other
/// node's by TCP.
fn srun_allreduce(c: &Cluster, env: &[(&str, &str)]) {
    let gwbench = path_of(&bin("gwbench"));
    let mut env = env.to_vec();
    env.push(("GW_DEBUG", "info"));
    let args = [
        "srun",
        "-N",
        "2",
        "-n",
        "4",
        &gwbench,
        "allreduce",
        "-c",
        "1",
    ];
    let run = c.run(&args, &env, Duration::from_secs(300));
    let all = run.all();
    assert!(run.status.success(), "{all}\n{}", c.logs());
    // The output the issue asks to see, for the record.
    println!("$ {}\n{}", args.join(" "), run.stdout);
    assert!(run.stdout.contains("nRanks 4"), "{all}");
    assert!(
        run.stdout.contains("# Out of bounds values : 0 OK"),
        "{all}"
    );
    for r in 0..4u32 {
        let init = format!(
            "rank {r}: init rank {r}/4 (local {}/2) via slurm variables, store gwnode1:",
            r % 2
        );
        assert!(run.stderr.contains(&init), "missing '{init}': {all}");
        for q in (0..4u32).filter(|&q| q != r) {
            let route = if node_of(q) == node_of(r) {
                "shm (same host)"
            } else {
                "tcp (other host)"
            };
            let line = format!("rank {r}: rank {q} (gwnode{}): {route}", node_of(q));
            assert!(run.stderr.contains(&line), "missing '{line}': {all}");
        }
    }
}

/// The other collectives, each checked exactly at every size up to 1 MiB.
fn srun_other_collectives(c: &Cluster, env: &[(&str, &str)]) {
    let gwbench = path_of(&bin("gwbench"));
    for coll in ["reduce_scatter", "allgather", "broadcast", "reduce"] {
        let args = [
            "srun", "-N", "2", "-n", "4", &gwbench, coll, "-c", "1", "-e", "1M",
        ];
        let run = c.run(&args, env, Duration::from_secs(300));
        let all = run.all();
        assert!(run.status.success(), "{coll}: {all}");
        assert!(
            run.stdout.contains(&format!("# gwbench {coll}"))
                && run.stdout.contains("# Out of bounds values : 0 OK"),
            "{coll}: {all}"
        );
    }
}

/// examples/c/allreduce.c, built against libgradwire.so, under srun: it
/// initialises with gwCommInitFromEnv and checks its results itself.
fn srun_c_example(c: &Cluster, env: &[(&str, &str)]) {
    let lib = bin_dir();
    assert!(
        lib.join("libgradwire.so").exists(),
        "{} is missing: cargo build -p gw-capi",
        lib.join("libgradwire.so").display()
    );
    let exe = c.dir.join("allreduce_c");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(repo().join("examples/c/allreduce.c"))
        .arg("-I")
        .arg(repo().join("capi/include"))
        .arg("-L")
        .arg(&lib)
        .args(["-lgradwire", "-lpthread"])
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc examples/c/allreduce.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut env = env.to_vec();
    let lib = path_of(&lib);
    env.push(("LD_LIBRARY_PATH", &lib));
    let exe = path_of(&exe);
    let run = c.run(
        &["srun", "-N", "2", "-n", "4", &exe],
        &env,
        Duration::from_secs(180),
    );
    let all = run.all();
    assert!(run.status.success(), "{all}");
    for r in 0..4 {
        assert!(
            run.stdout.contains(&format!("allreduce.c: rank {r} ok")),
            "rank {r}: {all}"
        );
    }
}

/// examples/python/train_digits.py under srun trains the same model as one
/// process over the same global batches: the same test accuracy.
fn srun_python_example(c: &Cluster, env: &[(&str, &str)]) {
    let train = path_of(&repo().join("examples/python/train_digits.py"));
    let steps = [
        "--steps",
        "60",
        "--global-batch",
        "128",
        "--lr",
        "0.5",
        "--seed",
        "0",
    ];
    let accuracy = |run: &Run| {
        let line = run
            .stdout
            .lines()
            .find(|l| l.contains("test accuracy"))
            .unwrap_or_else(|| panic!("no accuracy line: {}", run.all()));
        line.rsplit(' ').next().unwrap_or_default().to_owned()
    };
    let single = Command::new("python3")
        .arg(&train)
        .arg("--single")
        .args(steps)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning python3");
    let single = collect(single, Duration::from_secs(180), "train_digits.py --single");
    assert!(
        single.status.success(),
        "the Python example needs numpy and scikit-learn (scripts/python-deps.sh): {}",
        single.all()
    );
    let mut env = env.to_vec();
    let lib = path_of(&bin_dir().join("libgradwire.so"));
    let header = path_of(&repo().join("capi/include/gradwire.h"));
    let pythonpath = path_of(&repo().join("python"));
    env.extend([
        ("GRADWIRE_LIB", lib.as_str()),
        ("GRADWIRE_HEADER", header.as_str()),
        ("PYTHONPATH", pythonpath.as_str()),
    ]);
    let mut args = vec!["srun", "-N", "2", "-n", "4", "python3", &train];
    args.extend(steps);
    let run = c.run(&args, &env, Duration::from_secs(300));
    let all = run.all();
    assert!(run.status.success(), "{all}");
    assert!(
        run.stdout.contains("local batches [32, 32, 32, 32]"),
        "{all}"
    );
    assert_eq!(accuracy(&run), accuracy(&single), "{all}\n{}", single.all());
}

/// A step of gwbench that runs until stopped (one size, endless
/// iterations), started in the background with its output in a file; it
/// returns once rank 0 has printed its header, i.e. every rank is past
/// init and in the collective.
struct LongStep {
    child: std::process::Child,
    out: PathBuf,
    job: String,
}

impl LongStep {
    fn start(c: &Cluster, env: &[(&str, &str)], name: &str, extra: &[&str]) -> LongStep {
        let gwbench = path_of(&bin("gwbench"));
        let program = [
            gwbench.as_str(),
            "allreduce",
            "-b",
            "4M",
            "-e",
            "4M",
            "-n",
            "1000000",
            "-w",
            "0",
            "-c",
            "0",
        ];
        Self::start_program(c, env, name, extra, &program, "# gwbench allreduce")
    }

    /// As [`LongStep::start`], running `program`, which prints `ready` once
    /// its ranks are past init.
    fn start_program(
        c: &Cluster,
        env: &[(&str, &str)],
        name: &str,
        extra: &[&str],
        program: &[&str],
        ready: &str,
    ) -> LongStep {
        let out = c.dir.join(format!("{name}.out"));
        let file = std::fs::File::create(&out).expect("creating the step's output file");
        let err = file.try_clone().expect("cloning a file handle");
        let job_name = format!("--job-name={name}");
        let mut args = vec!["srun", "-N", "2", "-n", "4", "--label", &job_name];
        args.extend_from_slice(extra);
        args.extend_from_slice(program);
        let child = c
            .login(&args, env)
            .stdout(file)
            .stderr(err)
            .spawn()
            .expect("spawning srun");
        let mut step = LongStep {
            child,
            out,
            job: String::new(),
        };
        let t = Instant::now();
        while !step.output().contains(ready) {
            if t.elapsed() > Duration::from_secs(120)
                || step.child.try_wait().ok().flatten().is_some()
            {
                let _ = step.child.kill();
                panic!("{name}: the ranks never started: {}", step.output());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let q = c.run(
            &["squeue", "-h", "-n", name, "-o", "%i"],
            &[],
            Duration::from_secs(60),
        );
        step.job = q.stdout.trim().to_owned();
        assert!(
            !step.job.is_empty() && step.job.bytes().all(|b| b.is_ascii_digit()),
            "squeue -n {name}: {}",
            q.all()
        );
        step
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits for srun, failing the test past `deadline`.
    fn wait(mut self, deadline: Duration) -> (std::process::ExitStatus, String) {
        let t = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return (s, self.output()),
                Ok(None) if t.elapsed() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("srun still running after {deadline:?}: {}", self.output());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => panic!("waiting for srun: {e}"),
            }
        }
    }
}

/// The task pids of `job`'s step 0 on `node`, as its slurmd lists them:
/// (pid, global task id).
fn task_pids(c: &Cluster, node: &str, job: &str) -> Vec<(i32, u32)> {
    let run = c.on(node, &["scontrol", "listpids", &format!("{job}.0")]);
    run.stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [pid, j, "0", _, global] if *j == job => {
                    Some((pid.parse().ok()?, global.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

/// Lines of a `srun --label` output that task `r` printed.
fn lines_of(out: &str, r: u32) -> Vec<&str> {
    let label = format!("{r}: ");
    out.lines()
        .filter(|l| l.trim_start().starts_with(&label))
        .collect()
}

/// Rank 3 (on gwnode2, beside rank 2) killed mid-collective: ranks 0 and 1
/// (over TCP) and 2 (over shared memory) each fail naming rank 3, well
/// within GW_TIMEOUT, and the step exits non-zero. `-K0` keeps srun from
/// killing the survivors itself the moment one task dies, so that what is
/// checked is gradwire's own detection.
fn killed_rank_is_named(c: &Cluster, env: &[(&str, &str)]) {
    let step = LongStep::start(c, env, "gwkill", &["-K0"]);
    let pids = task_pids(c, "gwnode2", &step.job);
    let &(pid, _) = pids
        .iter()
        .find(|&&(_, global)| global == 3)
        .unwrap_or_else(|| panic!("no task 3 in scontrol listpids on gwnode2: {pids:?}"));
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "gwbench", "pid {pid} of task 3");
    // SAFETY: kill(2) on a pid Slurm listed as task 3 of this test's step.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill({pid}): {}", std::io::Error::last_os_error());
    let killed = Instant::now();
    let (status, out) = step.wait(Duration::from_secs(GW_TIMEOUT_S + 90));
    let took = killed.elapsed();
    assert!(!status.success(), "srun must fail: {out}");
    for r in 0..3u32 {
        let lines = lines_of(&out, r);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("gwbench: error") && l.contains("rank 3")),
            "rank {r} must fail naming rank 3: {out}"
        );
    }
    assert!(
        took < Duration::from_secs(GW_TIMEOUT_S),
        "the survivors took {took:?} (GW_TIMEOUT is {GW_TIMEOUT_S} s): {out}"
    );
}

/// `scancel --signal=KILL` of the whole step: srun exits non-zero and no
/// task is left on either node.
fn cancelled_step_ends(c: &Cluster, env: &[(&str, &str)]) {
    let step = LongStep::start(c, env, "gwcancel", &[]);
    let job = step.job.clone();
    let cancel = c.run(
        &["scancel", "--signal=KILL", &format!("{job}.0")],
        &[],
        Duration::from_secs(60),
    );
    assert!(cancel.status.success(), "scancel: {}", cancel.all());
    let (status, out) = step.wait(Duration::from_secs(60));
    assert!(!status.success(), "srun must fail: {out}");
    for node in ["gwnode1", "gwnode2"] {
        let left = task_pids(c, node, &job);
        assert!(left.is_empty(), "tasks left on {node}: {left:?}: {out}");
    }
}

/// `srun --time=1`: once the minute is up, Slurm ends the step (SIGTERM,
/// then SIGKILL KillWait later); every rank ends on the SIGTERM, none is
/// left, and srun says why. The ranks run a training loop's rhythm
/// (`gwtest paced`: an all-reduce, then a sleep), so that the minute costs
/// the machine little while the other cases run.
fn time_limit_ends_ranks(c: &Cluster, env: &[(&str, &str)]) {
    let gwtest = path_of(&bin("gwtest"));
    let step = LongStep::start_program(
        c,
        env,
        "gwtime",
        &["--time=1"],
        // At least 15000 x 20 ms = 300 s: well past the limit.
        &[&gwtest, "paced", "15000"],
        "paced ready",
    );
    let job = step.job.clone();
    // Slurm enforces limits every 30 s or so, past the minute.
    let (status, out) = step.wait(Duration::from_secs(240));
    assert!(!status.success(), "srun must fail: {out}");
    assert!(out.contains("DUE TO TIME LIMIT"), "{out}");
    assert!(!out.contains("Killed"), "a rank outlived SIGTERM: {out}");
    for node in ["gwnode1", "gwnode2"] {
        let left = task_pids(c, node, &job);
        assert!(left.is_empty(), "tasks left on {node}: {left:?}: {out}");
    }
}

/// examples/slurm/allreduce.sbatch as the README shows it, with gwbench on
/// the PATH: the script draws its own GW_TOKEN (none is passed in), and both
/// of its steps check every result.
fn sbatch_runs_the_example_script(c: &Cluster) {
    let script = path_of(&repo().join("examples/slurm/allreduce.sbatch"));
    let out = c.dir.join("sbatch.out");
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = format!("--output={}", out.display());
    let mut cmd = c.login(&["sbatch", "--wait", &output, &script], &[("PATH", &path)]);
    cmd.env_remove("GW_TOKEN");
    let child = cmd.spawn().expect("spawning sbatch");
    let run = collect(child, Duration::from_secs(400), "sbatch --wait");
    let job_out = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        run.status.success(),
        "{}\n--- job output\n{job_out}",
        run.all()
    );
    for coll in ["allreduce", "allgather"] {
        assert!(
            job_out.contains(&format!("# gwbench {coll}  nRanks 4")),
            "{coll}: {job_out}"
        );
    }
    assert_eq!(
        job_out.matches("# Out of bounds values : 0 OK").count(),
        2,
        "{job_out}"
    );
}

/// The job server's agents started by Slurm, one per node of an allocation,
/// with nothing but the server's address on their command line: each
/// registers its node as Slurm sees it (name and the job's CPUs there), and
/// a 4-worker gwtrain job submitted to the server runs two workers on each
/// node and succeeds.
fn agents_started_by_srun_run_a_job(c: &Cluster) {
    let login = c.login_prefix();
    let mut prefix = login.clone();
    prefix.extend(
        [
            "srun",
            "-N",
            "2",
            "--ntasks-per-node=1",
            "--exclusive",
            "--label",
        ]
        .map(String::from),
    );
    let login: Vec<&str> = login.iter().map(String::as_str).collect();
    let mut server = gw_tests::jobs::Cluster::start("slurm", "198.18.210.1:0", &login);
    let args = ["agent".to_string(), "--server".into(), server.url.clone()];
    let mut agents = gw_tests::jobs::Daemon::spawn(
        "srun gwjob agent",
        &prefix,
        &bin("gwjob"),
        &args,
        &[("GW_ADMIN_TOKEN".into(), server.token.clone())],
        server.dir.path().join("agents.log"),
    );
    for node in ["gwnode1", "gwnode2"] {
        agents.wait_for(Duration::from_secs(60), |out| {
            out.contains(&format!("node {node} (rack default, 2 slots, cpu)"))
                .then_some(())
        });
        agents.wait_for(Duration::from_secs(60), |out| {
            out.contains(&format!("registered node {node}"))
                .then_some(())
        });
    }
    let out = server.dir.path().join("train");
    let out_s = path_of(&out);
    let job = server.submit_gwtrain(
        &[
            "--workers",
            "4",
            "--global-batch",
            "128",
            "--planner",
            "even",
        ],
        &[
            "--steps",
            "20",
            "--dims",
            "32,64,10",
            "--seed",
            "3",
            "--print-every",
            "0",
            "--out",
            &out_s,
        ],
    );
    let (state, status) = server.wait_end(&job, Duration::from_secs(300));
    let log = agents.output();
    assert_eq!(state, "succeeded", "{status}\n{log}\n{}", server.logs());
    // Two workers on each node: the srun label is the node's task.
    for task in ["0", "1"] {
        let started = log
            .lines()
            .filter(|l| {
                l.starts_with(&format!("{task}: "))
                    && l.contains(&format!("started job {job} rank "))
            })
            .count();
        assert_eq!(started, 2, "agent task {task}: {log}");
    }
    agents.stop(Duration::from_secs(20));
    server.shutdown();
}
