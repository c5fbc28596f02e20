//! gwrun end to end: the real binary launching real processes (mostly `sh`),
//! checking environment, output tagging, failure handling, signals, program
//! lookup, usage errors, clean-up and the rendezvous store it starts.
//!
//! Every run is bounded: a hung gwrun is killed and the test fails with what it
//! printed, instead of hanging the suite.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const GWRUN: &str = env!("CARGO_BIN_EXE_gwrun");
/// Upper bound for any single gwrun run in these tests.
const LIMIT: Duration = Duration::from_secs(60);

struct Out {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
    elapsed: Duration,
}

impl Out {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// Stdout lines, sorted so that per-rank interleaving does not matter.
    fn sorted_lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.out().lines().map(str::to_owned).collect();
        v.sort();
        v
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?} after {:?}\n--- stdout\n{}--- stderr\n{}---",
            self.status,
            self.elapsed,
            self.out(),
            self.stderr
        )
    }
}

/// A started gwrun whose stdout can be watched line by line.
struct Job {
    child: Child,
    lines: Receiver<String>,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
    started: Instant,
}

fn gwrun_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(GWRUN);
    c.args(args);
    for v in [
        "GW_TRANSPORT",
        "GW_TIMEOUT",
        "GW_LANES",
        "GW_STORE_BIND",
        "GW_BIND_TO",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
    ] {
        c.env_remove(v);
    }
    c
}

/// Spawns `cmd`, retrying while its program is "text file busy": a test
/// that has just written an executable (a copy of gwrun) races with other
/// test threads forking, whose children hold the write descriptor until
/// they exec, and exec fails with ETXTBSY meanwhile.
fn spawn_retrying(cmd: &mut Command) -> Child {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cmd.spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => return r.expect("spawn gwrun"),
        }
    }
}

fn start(mut cmd: Command) -> Job {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = spawn_retrying(&mut cmd);
    let out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut all = Vec::new();
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            all.extend_from_slice(&line);
            let _ = tx.send(String::from_utf8_lossy(&line).trim_end().to_owned());
            line.clear();
        }
        all
    });
    let stderr = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = err.read_to_end(&mut all);
        all
    });
    Job {
        child,
        lines,
        stdout,
        stderr,
        started,
    }
}

impl Job {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for a stdout line satisfying `pred`.
    fn wait_line(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => {}
                Err(e) => panic!("no matching line from gwrun within {timeout:?}: {e}"),
            }
        }
    }

    fn finish(mut self) -> Out {
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if self.started.elapsed() > LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = self.stderr.join().unwrap();
                panic!(
                    "gwrun did not finish within {LIMIT:?}; stderr:\n{}",
                    String::from_utf8_lossy(&err)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        Out {
            status,
            stdout: self.stdout.join().unwrap(),
            stderr: String::from_utf8_lossy(&self.stderr.join().unwrap()).into_owned(),
            elapsed,
        }
    }
}

fn run_cmd(cmd: Command) -> Out {
    start(cmd).finish()
}

fn gwrun(args: &[&str]) -> Out {
    run_cmd(gwrun_cmd(args))
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|c| c.is_ascii_hexdigit())
}

fn assert_usage_error(out: &Out, needle: &str) {
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "want one line: {out:?}");
    assert!(out.stderr.starts_with("gwrun: error: "), "{out:?}");
    assert!(out.stderr.contains(needle), "want {needle:?}: {out:?}");
}

#[test]
fn ranks_get_their_environment() {
    let out = gwrun(&[
        "-n",
        "3",
        "sh",
        "-c",
        "echo $GW_RANK $GW_WORLD_SIZE $GW_LOCAL_RANK $GW_LOCAL_SIZE $GW_STORE $GW_TOKEN $GW_JOB_ID \
         ${GW_TRANSPORT-unset} ${GW_TIMEOUT-unset} ${GW_LANES-unset}",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let lines = out.sorted_lines();
    assert_eq!(lines.len(), 3, "{out:?}");
    let mut shared = None;
    for (r, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 11, "{line}");
        assert_eq!(f[0], format!("[{r}]"));
        assert_eq!(
            &f[1..5],
            [&*r.to_string(), "3", &*r.to_string(), "3"],
            "{line}"
        );
        let store = f[5];
        let port: u16 = store
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("GW_STORE {store}"));
        assert_ne!(port, 0);
        assert!(is_hex(f[6], 32), "token {}", f[6]);
        assert!(is_hex(f[7], 16), "job id {}", f[7]);
        assert_eq!(&f[8..], ["unset", "unset", "unset"], "{line}");
        let s = (f[5].to_owned(), f[6].to_owned(), f[7].to_owned());
        assert_eq!(shared.get_or_insert(s.clone()), &s, "ranks disagree");
    }
    // Fresh secrets per job.
    let (_, token, job_id) = shared.unwrap();
    let again = gwrun(&["-n", "1", "sh", "-c", "echo $GW_TOKEN $GW_JOB_ID"]);
    assert_eq!(again.code(), Some(0), "{again:?}");
    assert!(
        !again.out().contains(&token) && !again.out().contains(&job_id),
        "{again:?}"
    );
}

#[test]
fn option_variables_are_set_or_inherited() {
    let script = "echo $GW_TRANSPORT $GW_TIMEOUT $GW_LANES";
    let out = gwrun(&[
        "-n",
        "1",
        "--transport",
        "tcp",
        "--timeout",
        "2.5",
        "--lanes=3",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(out.out(), "[0] tcp 2.5 3\n", "{out:?}");

    let mut cmd = gwrun_cmd(&["-n", "1", "sh", "-c", script]);
    cmd.env("GW_TRANSPORT", "shm")
        .env("GW_TIMEOUT", "9")
        .env("GW_LANES", "4");
    let out = run_cmd(cmd);
    assert_eq!(
        out.out(),
        "[0] shm 9 4\n",
        "inherited values pass through: {out:?}"
    );

    let mut cmd = gwrun_cmd(&["-n", "1", "--transport=auto", "sh", "-c", script]);
    cmd.env("GW_TRANSPORT", "shm")
        .env("GW_TIMEOUT", "9")
        .env("GW_LANES", "4");
    let out = run_cmd(cmd);
    assert_eq!(out.out(), "[0] auto 9 4\n", "flags override: {out:?}");
}

#[test]
fn arguments_after_program_belong_to_it() {
    let out = gwrun(&[
        "-n",
        "1",
        "sh",
        "-c",
        "printf '%s|' \"$@\"",
        "sh",
        "-n",
        "5",
        "--help",
        "--",
    ]);
    assert_eq!(out.out(), "[0] -n|5|--help|--|\n", "{out:?}");
    let out = gwrun(&["-n", "1", "--", "sh", "-c", "echo ok"]);
    assert_eq!(out.out(), "[0] ok\n", "{out:?}");
}

#[test]
fn output_is_prefixed_per_rank_and_stream() {
    let out = gwrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo out-$GW_RANK; echo err-$GW_RANK >&2; echo two-$GW_RANK; printf tail-$GW_RANK",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(
        out.sorted_lines(),
        [
            "[0] out-0",
            "[0] tail-0",
            "[0] two-0",
            "[1] out-1",
            "[1] tail-1",
            "[1] two-1"
        ],
        "{out:?}"
    );
    let mut err: Vec<&str> = out.stderr.lines().collect();
    err.sort();
    assert_eq!(err, ["[0] err-0", "[1] err-1"], "{out:?}");
    // Order within one rank is kept.
    let text = out.out();
    let r0: Vec<&str> = text.lines().filter(|l| l.starts_with("[0]")).collect();
    assert_eq!(r0, ["[0] out-0", "[0] two-0", "[0] tail-0"]);
}

#[test]
fn non_utf8_output_passes_through() {
    let out = gwrun(&["-n", "1", "sh", "-c", "printf 'a\\377\\376b\\n'"]);
    assert_eq!(out.stdout, b"[0] a\xff\xfeb\n", "{out:?}");
}

#[test]
fn no_tag_output_passes_raw() {
    let out = gwrun(&[
        "-n",
        "2",
        "--no-tag-output",
        "sh",
        "-c",
        "echo plain; printf raw",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let text = out.out();
    assert_eq!(text.matches("plain\n").count(), 2, "{out:?}");
    assert_eq!(text.matches("raw").count(), 2, "{out:?}");
    assert!(!text.contains('['), "{out:?}");
}

#[test]
fn success_is_quiet_and_exits_zero() {
    let out = gwrun(&["-n", "2", "true"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
}

#[test]
fn eight_ranks() {
    let out = gwrun(&["-n", "8", "sh", "-c", "echo hi $GW_RANK of $GW_WORLD_SIZE"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let want: Vec<String> = (0..8).map(|r| format!("[{r}] hi {r} of 8")).collect();
    assert_eq!(out.sorted_lines(), want, "{out:?}");
}

#[test]
fn failing_rank_is_named_and_its_status_propagates() {
    let out = gwrun(&[
        "-n",
        "3",
        "sh",
        "-c",
        "if [ $GW_RANK = 2 ]; then exit 3; fi; sleep 30",
    ]);
    assert_eq!(out.code(), Some(3), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert_eq!(
        out.stderr, "gwrun: rank 2 exited with status 3\n",
        "{out:?}"
    );
}

#[test]
fn rank_killed_by_signal_stops_the_others() {
    let out = gwrun(&[
        "-n",
        "3",
        "sh",
        "-c",
        "if [ $GW_RANK = 1 ]; then kill -9 $$; fi; sleep 30",
    ]);
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert_eq!(out.code(), Some(128 + 9), "{out:?}");
    assert_eq!(
        out.stderr, "gwrun: rank 1 was killed by signal SIGKILL (9)\n",
        "{out:?}"
    );
}

#[test]
fn ranks_ignoring_sigterm_are_killed_after_the_grace_period() {
    // Rank 0 fails only once rank 1 ignores SIGTERM (ranks start with
    // SIGTERM deliverable, so the trap must be in place first).
    let ready = std::env::temp_dir().join(format!("gwrun-trap-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let script = format!(
        "if [ $GW_RANK = 0 ]; then while [ ! -e {r} ]; do sleep 0.01; done; exit 1; fi; trap '' TERM; touch {r}; sleep 30",
        r = ready.display()
    );
    let out = gwrun(&["-n", "2", "sh", "-c", &script]);
    let _ = std::fs::remove_file(&ready);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.elapsed >= Duration::from_millis(2900), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert!(
        out.stderr
            .starts_with("gwrun: rank 0 exited with status 1\n"),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("gwrun: rank 1 still running 3 s after SIGTERM; sending SIGKILL"),
        "{out:?}"
    );
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    let job = start(gwrun_cmd(&[
        "-n",
        "2",
        "sh",
        "-c",
        "trap 'echo got-term-$GW_RANK; exit 7' TERM; echo ready-$GW_RANK; while :; do sleep 0.1; done",
    ]));
    job.wait_line(|l| l.contains("ready-"), Duration::from_secs(20));
    job.wait_line(|l| l.contains("ready-"), Duration::from_secs(20));
    let sent = Instant::now();
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(job.pid(), libc::SIGTERM);
    }
    let out = job.finish();
    assert!(sent.elapsed() < Duration::from_secs(4), "{out:?}");
    assert_eq!(out.code(), Some(128 + 15), "{out:?}");
    let text = out.out();
    assert!(
        text.contains("[0] got-term-0\n") && text.contains("[1] got-term-1\n"),
        "{out:?}"
    );
    assert!(out.stderr.contains("gwrun: received SIGTERM"), "{out:?}");
    assert!(
        !out.stderr.contains("exited with status"),
        "consequences are not reported: {out:?}"
    );
}

#[test]
fn sigint_then_escalation_for_stubborn_ranks() {
    let job = start(gwrun_cmd(&[
        "-n",
        "2",
        "sh",
        "-c",
        "trap '' INT; echo ready; sleep 30",
    ]));
    job.wait_line(|l| l.contains("ready"), Duration::from_secs(20));
    job.wait_line(|l| l.contains("ready"), Duration::from_secs(20));
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(job.pid(), libc::SIGINT);
    }
    std::thread::sleep(Duration::from_millis(300));
    // A second signal kills at once instead of waiting 5 s.
    let sent = Instant::now();
    unsafe {
        libc::kill(job.pid(), libc::SIGINT);
    }
    let out = job.finish();
    assert!(sent.elapsed() < Duration::from_secs(3), "{out:?}");
    assert_eq!(out.code(), Some(128 + 2), "{out:?}");
    assert!(
        out.stderr
            .contains("received SIGINT again; killing the ranks"),
        "{out:?}"
    );
}

fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S ..." — a zombie waiting for its new parent counts as gone.
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn ranks_die_with_gwrun() {
    let job = start(gwrun_cmd(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo pid $$; exec sleep 30",
    ]));
    let mut pids = Vec::new();
    for _ in 0..2 {
        let l = job.wait_line(|l| l.contains("pid "), Duration::from_secs(20));
        pids.push(l.rsplit(' ').next().unwrap().parse::<i32>().unwrap());
    }
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(job.pid(), libc::SIGKILL);
    }
    let out = job.finish();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&p| process_gone(p)) {
        assert!(
            Instant::now() < deadline,
            "ranks {pids:?} outlived gwrun: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn grandchildren_do_not_keep_gwrun_alive() {
    // The rank exits at once but leaves a background child holding its stdout.
    let out = gwrun(&["-n", "1", "sh", "-c", "sleep 30 & echo started"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(10), "{out:?}");
    assert_eq!(out.out(), "[0] started\n");
}

#[test]
fn shared_memory_files_are_removed() {
    if !Path::new("/dev/shm").is_dir() {
        return;
    }
    let out = gwrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        "touch /dev/shm/gw-$GW_JOB_ID-test-$GW_RANK && echo $GW_JOB_ID",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let job_id = out
        .out()
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("[0] ")
        .trim_start_matches("[1] ")
        .to_owned();
    assert!(is_hex(&job_id, 16), "{out:?}");
    for r in 0..2 {
        let f = format!("/dev/shm/gw-{job_id}-test-{r}");
        assert!(!Path::new(&f).exists(), "{f} left behind");
    }
}

#[test]
fn program_lookup_errors() {
    let out = gwrun(&["-n", "1", "gw-no-such-program-xyz"]);
    assert_usage_error(&out, "'gw-no-such-program-xyz' not found");
    let out = gwrun(&["-n", "1", "./no/such/program"]);
    assert_usage_error(&out, "program not found: ./no/such/program");
    let out = gwrun(&["-n", "1", "/"]);
    assert_usage_error(&out, "directory");
    let dir = scratch("noexec");
    let f = dir.join("data.txt");
    std::fs::write(&f, "not a program").unwrap();
    let out = gwrun(&["-n", "1", f.to_str().unwrap()]);
    assert_usage_error(&out, "not executable");
    let _ = std::fs::remove_dir_all(dir);
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gwrun-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn program_beside_gwrun_is_found_first() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("beside");
    let gw = dir.join("gwrun");
    std::fs::copy(GWRUN, &gw).unwrap();
    let tool = dir.join("gw-beside-probe");
    std::fs::write(&tool, "#!/bin/sh\necho beside $GW_RANK\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(&gw);
    cmd.args(["-n", "2", "gw-beside-probe"])
        .env("PATH", "/usr/bin:/bin");
    let out = run_cmd(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(
        out.sorted_lines(),
        ["[0] beside 0", "[1] beside 1"],
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_command_lines_exit_2_with_one_line() {
    for (args, needle) in [
        (&[][..], "missing -n"),
        (&["sh"], "missing -n"),
        (&["-n", "2"], "missing PROGRAM"),
        (&["-n", "0", "sh"], "at least 1"),
        (&["-n", "x", "sh"], "'x'"),
        (&["-n"], "requires a value"),
        (&["--bogus", "-n", "1", "sh"], "unknown option '--bogus'"),
        (
            &["-n", "1", "--transport", "udp", "sh"],
            "auto, tcp, shm, ofi",
        ),
        (&["-n", "1", "--timeout", "0", "sh"], "--timeout"),
        (&["-n", "1", "--lanes", "-2", "sh"], "--lanes"),
        (&["-n", "1", "--store-bind", "here", "sh"], "--store-bind"),
        (&["-n", "1", "--bind-to", "core", "sh"], "share, none"),
        (&["-n", "1", "--"], "missing PROGRAM"),
    ] {
        let out = gwrun(args);
        assert_usage_error(&out, needle);
    }
    let mut cmd = gwrun_cmd(&["-n", "1", "true"]);
    cmd.env("GW_STORE_BIND", "not-an-address");
    assert_usage_error(&run_cmd(cmd), "GW_STORE_BIND");
    let mut cmd = gwrun_cmd(&["-n", "1", "true"]);
    cmd.env("GW_BIND_TO", "socket");
    assert_usage_error(&run_cmd(cmd), "GW_BIND_TO");
}

#[test]
fn help_documents_flags_and_variables() {
    let out = gwrun(&["--help"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let text = out.out();
    for w in [
        "-n N",
        "--transport",
        "--timeout",
        "--lanes",
        "--tag-output",
        "--no-tag-output",
        "--store-bind",
        "--store-addr",
        "--bind-to",
        "--report-bindings",
        "GW_BIND_TO",
        "GW_RANK",
        "GW_WORLD_SIZE",
        "GW_LOCAL_RANK",
        "GW_LOCAL_SIZE",
        "GW_STORE",
        "GW_TOKEN",
        "GW_JOB_ID",
        "exit status",
    ] {
        assert!(text.contains(w), "--help lacks {w}");
    }
}

/// torchrun's variables, so that PyTorch's own rendezvous works under gwrun.
#[test]
fn ranks_get_torchruns_variables_too() {
    let out = gwrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let lines = out.sorted_lines();
    assert_eq!(lines.len(), 2, "{out:?}");
    let mut ports = Vec::new();
    for (r, line) in lines.iter().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 7, "{line}");
        assert_eq!(
            &f[1..5],
            [&*r.to_string(), "2", &*r.to_string(), "2"],
            "{line}"
        );
        assert_eq!(f[5], "127.0.0.1", "{line}");
        let port: u16 = f[6].parse().unwrap_or(0);
        assert!(port > 0, "{line}");
        ports.push(port);
    }
    assert_eq!(ports[0], ports[1], "one MASTER_PORT for the job");
    // Inherited ones are left alone.
    let out = gwrun_cmd(&["-n", "1", "sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT"])
        .env("MASTER_ADDR", "10.9.8.7")
        .env("MASTER_PORT", "4242")
        .output()
        .expect("gwrun");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("10.9.8.7:4242"),
        "{out:?}"
    );
}

/// Each rank's OpenMP threads: its share of gwrun's processors, at least
/// one; an inherited OMP_NUM_THREADS is left alone.
#[test]
fn ranks_get_their_share_of_openmp_threads() {
    let cpus = gw_rendezvous::peers::own_cpus().len();
    assert!(cpus > 0, "this process's processors are unknown");
    for n in [1usize, 2, cpus + 1] {
        let out = gwrun(&["-n", &n.to_string(), "sh", "-c", "echo $OMP_NUM_THREADS"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let want = (cpus / n).max(1).to_string();
        let lines = out.sorted_lines();
        assert_eq!(lines.len(), n, "{out:?}");
        for line in &lines {
            assert_eq!(
                line.split(' ').nth(1),
                Some(want.as_str()),
                "n={n}: {out:?}"
            );
        }
    }
    let out = gwrun_cmd(&["-n", "2", "sh", "-c", "echo threads=$OMP_NUM_THREADS"])
        .env("OMP_NUM_THREADS", "7")
        .output()
        .expect("gwrun");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("threads=7").count(), 2, "{out:?}");
    // An empty one is unset to OpenMP, and so to gwrun.
    let out = gwrun_cmd(&["-n", "1", "sh", "-c", "echo threads=$OMP_NUM_THREADS"])
        .env("OMP_NUM_THREADS", "")
        .output()
        .expect("gwrun");
    let want = format!("threads={cpus}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&want),
        "{want}: {out:?}"
    );
}

#[test]
fn store_bind_and_advertised_address() {
    let script = "echo $GW_STORE";
    let out = gwrun(&["-n", "1", "--store-bind", "0.0.0.0", "sh", "-c", script]);
    let line = out.out();
    assert!(
        line.starts_with("[0] 127.0.0.1:") && !line.contains(":0\n"),
        "{out:?}"
    );

    let out = gwrun(&[
        "-n",
        "1",
        "--store-bind",
        "0.0.0.0",
        "--store-addr",
        "10.9.8.7",
        "sh",
        "-c",
        script,
    ]);
    let line = out.out();
    assert!(line.starts_with("[0] 10.9.8.7:"), "{out:?}");
    assert!(
        line.trim_end()
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
            > 0
    );

    let out = gwrun(&["-n", "1", "--store-addr", "node7:1234", "sh", "-c", script]);
    assert_eq!(out.out(), "[0] node7:1234\n", "{out:?}");

    let mut cmd = gwrun_cmd(&["-n", "1", "sh", "-c", script]);
    cmd.env("GW_STORE_BIND", "127.0.0.1");
    let out = run_cmd(cmd);
    assert!(out.out().starts_with("[0] 127.0.0.1:"), "{out:?}");
}

/// Runs this test binary's `rank_uses_the_store` as the ranks: they meet in the
/// store gwrun started, authenticated with its token.
#[test]
fn ranks_meet_in_the_store() {
    let me = std::env::current_exe().unwrap();
    let mut cmd = gwrun_cmd(&[
        "-n",
        "3",
        me.to_str().unwrap(),
        "--exact",
        "rank_uses_the_store",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd.env("GW_TEST_STORE_RANK", "1");
    let out = run_cmd(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let text = out.out();
    for r in 0..3 {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("[{r}] "))
                && l.ends_with(&format!("store-ok rank {r} saw 3 ranks"))),
            "{out:?}"
        );
    }
}

/// Not a test on its own: the rank side of [`ranks_meet_in_the_store`].
#[test]
#[ignore = "run by ranks_meet_in_the_store under gwrun"]
fn rank_uses_the_store() {
    use gw_rendezvous::StoreClient;
    if std::env::var_os("GW_TEST_STORE_RANK").is_none() {
        return;
    }
    let addr = std::env::var("GW_STORE").unwrap();
    let token = std::env::var("GW_TOKEN").unwrap();
    let rank: usize = std::env::var("GW_RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("GW_WORLD_SIZE").unwrap().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);

    assert!(
        StoreClient::connect(&addr, "wrong-token", deadline).is_err(),
        "the store accepted a wrong token"
    );
    let mut c = StoreClient::connect(&addr, &token, deadline).unwrap();
    c.set(&format!("rank/{rank}"), rank.to_string().as_bytes())
        .unwrap();
    let keys: Vec<String> = (0..world).map(|r| format!("rank/{r}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let vals = c.wait(&keys, deadline).unwrap();
    assert_eq!(vals.len(), world);
    println!("store-ok rank {rank} saw {} ranks", vals.len());
}

/// gwrun blocks SIGINT/SIGTERM/SIGCHLD on its own main thread; its ranks must
/// not inherit that mask, or a forwarded SIGTERM would never reach them.
#[test]
fn ranks_start_with_no_blocked_signals() {
    let out = gwrun(&["-n", "2", "grep", "SigBlk", "/proc/self/status"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let lines = out.sorted_lines();
    assert_eq!(lines.len(), 2, "{out:?}");
    for l in lines {
        let mask = l.rsplit(['\t', ' ']).next().unwrap_or("");
        assert!(
            !mask.is_empty() && mask.bytes().all(|b| b == b'0'),
            "a rank started with blocked signals: {l}"
        );
    }
}

/// `0-3,8` (as /proc/self/status and taskset write processor lists).
fn parse_cpu_list(list: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u32, u32) = (lo.parse().expect("cpu"), hi.parse().expect("cpu"));
        cpus.extend(lo..=hi);
    }
    cpus
}

/// Each rank's processors, by rank, from ranks printing their own list.
fn ranks_cpus(mut cmd: Command, ranks: usize) -> Vec<Vec<u32>> {
    cmd.args([
        "sh",
        "-c",
        "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status",
    ]);
    let out = run_cmd(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let lines = out.sorted_lines();
    assert_eq!(lines.len(), ranks, "{out:?}");
    lines
        .iter()
        .enumerate()
        .map(|(r, l)| {
            let list = l.strip_prefix(&format!("[{r}] ")).expect("tagged line");
            parse_cpu_list(list)
        })
        .collect()
}

/// Ranks get equal runs of consecutive processors from gwrun's own set, as
/// many as fit; with more ranks than processors, or when told not to bind,
/// each keeps gwrun's whole set.
#[test]
fn ranks_run_on_equal_shares_of_gwruns_processors() {
    // The processors this test may run on; gwrun inherits them.
    let all = gw_rendezvous::peers::own_cpus();
    assert!(!all.is_empty());
    for n in [1, 2, 3] {
        if n > all.len() {
            continue;
        }
        let k = all.len() / n;
        let got = ranks_cpus(gwrun_cmd(&["-n", &n.to_string()]), n);
        let want: Vec<Vec<u32>> = (0..n).map(|r| all[r * k..(r + 1) * k].to_vec()).collect();
        assert_eq!(got, want, "{n} ranks on {all:?}");
    }
    let over = all.len() + 1;
    let got = ranks_cpus(gwrun_cmd(&["-n", &over.to_string()]), over);
    assert!(got.iter().all(|c| *c == all), "oversubscribed: {got:?}");

    let n = all.len().min(2);
    let got = ranks_cpus(gwrun_cmd(&["-n", &n.to_string(), "--bind-to", "none"]), n);
    assert!(got.iter().all(|c| *c == all), "--bind-to none: {got:?}");
    let mut cmd = gwrun_cmd(&["-n", &n.to_string()]);
    cmd.env("GW_BIND_TO", "none");
    let got = ranks_cpus(cmd, n);
    assert!(got.iter().all(|c| *c == all), "GW_BIND_TO=none: {got:?}");
    // The flag wins over the variable.
    let mut cmd = gwrun_cmd(&["-n", "1", "--bind-to", "share"]);
    cmd.env("GW_BIND_TO", "none");
    assert_eq!(ranks_cpus(cmd, 1), vec![all]);
}

/// gwrun shares out the set it was started with (taskset, cgroups), and
/// `--report-bindings` says what each rank got.
#[test]
fn bindings_respect_gwruns_own_mask_and_are_reported() {
    // The processors this test may run on; gwrun inherits them.
    let all = gw_rendezvous::peers::own_cpus();
    let last = *all.last().expect("a processor");
    let mut cmd = Command::new("taskset");
    cmd.args([
        "-c",
        &last.to_string(),
        GWRUN,
        "-n",
        "1",
        "--report-bindings",
    ]);
    cmd.env_remove("GW_BIND_TO");
    let got = ranks_cpus(cmd, 1);
    assert_eq!(got, [vec![last]]);

    let mut cmd = gwrun_cmd(&["-n", "1", "--report-bindings"]);
    cmd.arg("true");
    let out = run_cmd(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("gwrun: rank 0 bound to processors "),
        "{out:?}"
    );
    let over = (all.len() + 1).to_string();
    let out = run_cmd({
        let mut c = gwrun_cmd(&["-n", &over, "--report-bindings"]);
        c.arg("true");
        c
    });
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "ranks not bound: {over} ranks on {} processors",
            all.len()
        )),
        "{out:?}"
    );
}
