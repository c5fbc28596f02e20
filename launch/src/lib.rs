//! gradwire's launcher layer: `gwrun` (in the style of mpirun and torchrun),
//! and the pieces the job server's agent starts its workers with.
//!
//! It lives in a library rather than in the binary so that every piece can
//! be unit-tested, and so that the agent shares it: [`args`] parses gwrun's
//! command line, [`program`] finds the program, [`child`] starts a rank the
//! way every launcher must, [`spawn`] gives gwrun's ranks their launch
//! environment, [`output`] tags their output, [`signals`] and [`job`]
//! supervise them. `src/bin/gwrun.rs` parses with [`args::parse`], prints
//! help and usage errors itself, and calls [`run`]. Nothing here needs a
//! database or an HTTP stack: building gwrun compiles neither.
//!
//! The order of a run, and why:
//! 1. parse arguments and resolve PROGRAM *before* anything is started, so a
//!    typo costs nothing and exits 2;
//! 2. block SIGINT/SIGTERM/SIGCHLD before any thread exists (see [`signals`]);
//! 3. start the rendezvous store in-process, so its lifetime is exactly the
//!    job's and ranks never race a separately started store;
//! 4. spawn every rank into one process group, start the output forwarders;
//! 5. supervise until every rank is reaped;
//! 6. SIGKILL whatever the ranks left behind in their group (it would hold
//!    our pipes open), drain the output, stop the store, and remove the job's
//!    shared-memory files `/dev/shm/gw-<job id>-*`, which a crashed rank
//!    cannot unlink itself.
//!
//! Exit statuses are listed in `gwrun --help`: 0 success; the failing rank's
//! status, or 128 + signal; [`EXIT_INTERNAL`] when gwrun itself fails;
//! [`EXIT_USAGE`] for usage errors, here (PROGRAM not found) and in the
//! binary (a bad command line).

#[macro_use]
mod say;
pub mod args;
pub mod bind;
pub mod child;
pub mod job;
pub mod output;
pub mod program;
pub mod signals;
pub mod spawn;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gw_rendezvous::launch_env::var;
use gw_rendezvous::token::random_hex;
use gw_rendezvous::{StoreConfig, StoreServer};

use args::Options;
use job::RankProc;
use output::Stream;
use signals::Signals;
use spawn::RankPlan;

/// Exit status for usage errors and a PROGRAM that cannot be found.
pub const EXIT_USAGE: i32 = 2;
/// Exit status when gwrun itself fails (store, spawn).
pub const EXIT_INTERNAL: i32 = 1;
/// How long to wait for rank output to drain after the last rank is gone.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// OpenMP's thread count, set for every rank (see [`bind::threads_per_rank`]).
const OMP_NUM_THREADS: &str = "OMP_NUM_THREADS";

fn usage_error(msg: &str) -> i32 {
    say!("error: {msg}");
    EXIT_USAGE
}

fn internal_error(msg: &str) -> i32 {
    say!("error: {msg}");
    EXIT_INTERNAL
}

/// Launches the job described by `opts` and waits for it; returns gwrun's
/// exit status. Problems found on the way are reported with `say!`.
pub fn run(opts: Options) -> i32 {
    let program = match program::find_program(&opts.program) {
        Ok(p) => p,
        Err(e) => return usage_error(&e.0),
    };
    let bind = match setting(
        opts.store_bind,
        var::STORE_BIND,
        args::parse_bind,
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
    ) {
        Ok(b) => b,
        Err(e) => return usage_error(&e),
    };
    let policy = match setting(
        opts.bind_to,
        var::BIND_TO,
        bind::BindTo::parse,
        bind::BindTo::Share,
    ) {
        Ok(b) => b,
        Err(e) => return usage_error(&e),
    };
    let allowed = gw_rendezvous::peers::own_cpus();
    let cpus = bind::shares(policy, &allowed, opts.nprocs);
    if opts.report_bindings {
        report_bindings(cpus.as_deref(), policy, &allowed, opts.nprocs);
    }
    let (token, job_id) = match (random_hex(16), random_hex(8)) {
        (Ok(t), Ok(j)) => (t, j),
        (Err(e), _) | (_, Err(e)) => {
            return internal_error(&format!("cannot read /dev/urandom: {e}"));
        }
    };

    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return internal_error(&format!("cannot install signal handlers: {e}")),
    };
    let store = match StoreServer::start(bind, &token, StoreConfig::default()) {
        Ok(s) => s,
        Err(e) => {
            return internal_error(&format!("cannot start the rendezvous store on {bind}: {e}"));
        }
    };
    let store_addr = args::advertised_store(opts.store_addr.as_deref(), store.local_addr());

    let mut settings = Vec::new();
    if let Some(t) = opts.transport {
        settings.push(("GW_TRANSPORT", t.as_str().to_owned()));
    }
    if let Some(t) = &opts.timeout {
        settings.push(("GW_TIMEOUT", t.clone()));
    }
    if let Some(k) = opts.lanes {
        settings.push(("GW_LANES", k.to_string()));
    }
    // Each rank's OpenMP threads within its share of the processors (see
    // `bind::threads_per_rank`; torchrun sets 1); an inherited value is the
    // user's choice.
    if std::env::var_os(OMP_NUM_THREADS).is_none_or(|v| v.is_empty())
        && let Some(n) = bind::threads_per_rank(allowed.len(), opts.nprocs)
    {
        settings.push((OMP_NUM_THREADS, n.to_string()));
    }
    // torchrun's rendezvous variables, so that a PyTorch program (any
    // backend) initialises under gwrun as under torchrun; the per-rank ones
    // are set in `spawn`. Inherited ones are left alone.
    use var::torchrun::{MASTER_ADDR, MASTER_PORT};
    if std::env::var_os(MASTER_ADDR).is_none() {
        settings.push((MASTER_ADDR, spawn::store_host(&store_addr).to_owned()));
    }
    if std::env::var_os(MASTER_PORT).is_none() {
        match std::net::TcpListener::bind(SocketAddr::new(bind.ip(), 0))
            .and_then(|l| l.local_addr())
        {
            Ok(a) => settings.push((MASTER_PORT, a.port().to_string())),
            Err(e) => {
                return internal_error(&format!(
                    "cannot find a free port for MASTER_PORT on {}: {e}",
                    bind.ip()
                ));
            }
        }
    }
    let plan = RankPlan {
        program,
        args: opts.args,
        world: opts.nprocs as u32,
        store: store_addr,
        token,
        job_id: job_id.clone(),
        settings,
        pipe_output: opts.tag_output,
        cpus,
    };

    let code = launch(&plan, &mut signals);

    store.shutdown();
    remove_shm_files(Path::new("/dev/shm"), &job_id);
    drop(signals);
    code
}

/// A setting from its flag, else from the variable `name` (unless unset or
/// blank), else `default`; a bad variable is an error naming it.
fn setting<T>(
    flag: Option<T>,
    name: &str,
    parse: impl Fn(&str) -> Result<T, String>,
    default: T,
) -> Result<T, String> {
    if let Some(v) = flag {
        return Ok(v);
    }
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => parse(&v).map_err(|e| format!("{name}: {e}")),
        _ => Ok(default),
    }
}

/// `--report-bindings`: one line per rank, or one saying why none is bound.
fn report_bindings(cpus: Option<&[Vec<u32>]>, policy: bind::BindTo, allowed: &[u32], ranks: usize) {
    let all = bind::list(allowed);
    match cpus {
        Some(shares) => {
            for (rank, share) in shares.iter().enumerate() {
                say!("rank {rank} bound to processors {}", bind::list(share));
            }
        }
        None if policy == bind::BindTo::None => {
            say!("ranks not bound (--bind-to none): each may use processors {all}");
        }
        None if allowed.is_empty() => {
            say!("ranks not bound: the kernel did not say which processors gwrun may use");
        }
        None => say!(
            "ranks not bound: {ranks} ranks on {} processors ({all}) must take turns",
            allowed.len()
        ),
    }
}

/// Spawns, supervises and cleans up the ranks; returns the exit status.
fn launch(plan: &RankPlan, signals: &mut Signals) -> i32 {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut ranks: Vec<RankProc> = Vec::with_capacity(plan.world as usize);
    let mut pgid: Option<i32> = None;
    let mut code = None;
    for rank in 0..plan.world as usize {
        let mut child = match plan.spawn(rank as u32, pgid) {
            Ok(c) => c,
            Err(e) => {
                code = Some(internal_error(&format!(
                    "cannot start rank {rank} ({}): {e}",
                    plan.program.display()
                )));
                break;
            }
        };
        pgid.get_or_insert(child.id() as i32);
        if let Some(out) = child.stdout.take() {
            start_forwarder(rank, out, Stream::Stdout, &done_tx);
        }
        if let Some(err) = child.stderr.take() {
            start_forwarder(rank, err, Stream::Stderr, &done_tx);
        }
        ranks.push(RankProc {
            rank,
            child,
            status: None,
        });
    }
    drop(done_tx);

    let Some(pgid) = pgid else {
        return code.unwrap_or(EXIT_INTERNAL);
    };
    let code = match code {
        Some(c) => {
            // A later rank failed to start: the job cannot run without it.
            job::signal_ranks(pgid, &ranks, libc::SIGKILL);
            for r in &mut ranks {
                let _ = r.child.wait();
            }
            c
        }
        None => job::supervise(&mut ranks, pgid, signals),
    };

    // Anything still in the group was forked by a rank and outlived it.
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let deadline = Instant::now() + DRAIN_GRACE;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match done_rx.recv_timeout(left) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                say!(
                    "rank output still open {} s after the job ended; not waiting for it",
                    DRAIN_GRACE.as_secs()
                );
                break;
            }
        }
    }
    code
}

fn start_forwarder(
    rank: usize,
    src: impl std::io::Read + Send + 'static,
    stream: Stream,
    done: &mpsc::Sender<()>,
) {
    if let Err(e) = output::forward(rank, src, stream, done.clone()) {
        say!("cannot start an output thread for rank {rank}: {e}");
    }
}

/// Removes `dir/gw-<job_id>-*`, the job's shared-memory segments; errors are
/// ignored (another process may have removed them first).
pub fn remove_shm_files(dir: &Path, job_id: &str) {
    let prefix = format!("gw-{job_id}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name()
            .as_encoded_bytes()
            .starts_with(prefix.as_bytes())
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_cleanup_touches_only_this_job() {
        let d = std::env::temp_dir().join(format!("gwrun-shm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for f in [
            "gw-abc-0",
            "gw-abc-ring-1",
            "gw-abcd-0",
            "gw-xyz-0",
            "other",
        ] {
            std::fs::write(d.join(f), b"").unwrap();
        }
        remove_shm_files(&d, "abc");
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["gw-abcd-0", "gw-xyz-0", "other"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
