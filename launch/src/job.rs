//! Supervising the running ranks: reaping them, reacting to the first
//! failure, forwarding signals, and escalating to SIGKILL.
//!
//! One loop on gwrun's main thread does all of it, woken by SIGCHLD or
//! SIGINT/SIGTERM (see [`crate::signals`]) or by the next kill deadline, so
//! that decisions are taken in one place and in order. A failure is reported
//! only while the job is still running normally: ranks that die of the SIGTERM
//! gwrun itself sent are consequences, not causes, and are not reported.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use crate::signals::{Signals, signal_name};

/// How long ranks get to exit after a SIGINT/SIGTERM forwarded from the user.
pub const FORWARD_GRACE: Duration = Duration::from_secs(5);
/// How long the other ranks get to exit after one rank failed.
pub const FAILURE_GRACE: Duration = Duration::from_secs(3);
/// Longest sleep between checks when nothing wakes the loop (a safety net:
/// SIGCHLD normally wakes it at once).
const TICK: Duration = Duration::from_millis(500);

/// One spawned rank.
pub struct RankProc {
    pub rank: usize,
    pub child: Child,
    pub status: Option<ExitStatus>,
}

/// The status gwrun exits with for a rank that ended with `st`: its exit
/// code, or 128 + the signal that killed it (as a shell reports it).
pub fn exit_code_of(st: ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// The line gwrun prints for a failed rank.
pub fn describe_failure(rank: usize, st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("gwrun: rank {rank} exited with status {c}"),
        (None, Some(s)) => format!(
            "gwrun: rank {rank} was killed by signal {} ({s})",
            signal_name(s)
        ),
        (None, None) => format!("gwrun: rank {rank} ended with {st}"),
    }
}

/// Sends `sig` to the ranks' process group, and directly to any live rank that
/// has left the group (so that a rank calling `setsid` is still reached).
pub fn signal_ranks(pgid: i32, ranks: &[RankProc], sig: libc::c_int) {
    // SAFETY: kill/getpgid have no memory-safety preconditions. `pgid` is the
    // pid of rank 0, which we spawned; a live rank's pid cannot be reused
    // because we have not reaped it.
    unsafe {
        libc::kill(-pgid, sig);
        for r in ranks.iter().filter(|r| r.status.is_none()) {
            let pid = r.child.id() as libc::pid_t;
            if libc::getpgid(pid) != pgid {
                libc::kill(pid, sig);
            }
        }
    }
}

enum Phase {
    Running,
    /// Stopping after a failure or a forwarded signal; SIGKILL at `kill_at`
    /// unless `killed` already.
    Stopping {
        kill_at: Instant,
        grace: Duration,
        /// The signal sent when stopping began.
        sent: libc::c_int,
        killed: bool,
    },
}

/// Waits for every rank, handling failures and signals as documented in
/// `gwrun --help`. Returns gwrun's exit status. Messages go to stderr.
pub fn supervise(ranks: &mut [RankProc], pgid: i32, signals: &mut Signals) -> i32 {
    let mut phase = Phase::Running;
    let mut cause: Option<i32> = None;
    loop {
        // 1. Reap whatever has exited.
        let was_running = matches!(phase, Phase::Running);
        let mut failed = false;
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            let st = match r.child.try_wait() {
                Ok(Some(st)) => st,
                Ok(None) => continue,
                Err(e) => {
                    // Cannot happen for our own unreaped child; do not spin on it.
                    say!("cannot wait for rank {}: {e}", r.rank);
                    ExitStatus::from_raw(1 << 8)
                }
            };
            r.status = Some(st);
            if !st.success() && was_running {
                crate::say::line(&describe_failure(r.rank, st));
                cause.get_or_insert(exit_code_of(st));
                failed = true;
            }
        }
        if failed {
            signal_ranks(pgid, ranks, libc::SIGTERM);
            phase = Phase::Stopping {
                kill_at: Instant::now() + FAILURE_GRACE,
                grace: FAILURE_GRACE,
                sent: libc::SIGTERM,
                killed: false,
            };
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            return cause.unwrap_or(0);
        }

        // 2. Signals from the user.
        if let Some((count, sig)) = signals.take_terminate() {
            let name = signal_name(sig);
            match &mut phase {
                Phase::Running => {
                    say!("received {name}; forwarding it to the ranks");
                    signal_ranks(pgid, ranks, sig);
                    cause.get_or_insert(128 + sig);
                    phase = Phase::Stopping {
                        kill_at: Instant::now() + FORWARD_GRACE,
                        grace: FORWARD_GRACE,
                        sent: sig,
                        killed: count > 1,
                    };
                    if count > 1 {
                        say!("received {name} again; killing the ranks");
                        signal_ranks(pgid, ranks, libc::SIGKILL);
                    }
                }
                Phase::Stopping { killed, .. } if !*killed => {
                    say!("received {name} again; killing the ranks");
                    cause.get_or_insert(128 + sig);
                    signal_ranks(pgid, ranks, libc::SIGKILL);
                    *killed = true;
                }
                Phase::Stopping { .. } => {}
            }
        }

        // 3. Escalate when the grace period is over.
        let now = Instant::now();
        let mut sleep = TICK;
        if let Phase::Stopping {
            kill_at,
            grace,
            sent,
            killed,
        } = &mut phase
            && !*killed
        {
            if now >= *kill_at {
                let left: Vec<String> = ranks
                    .iter()
                    .filter(|r| r.status.is_none())
                    .map(|r| r.rank.to_string())
                    .collect();
                say!(
                    "rank{} {} still running {} s after {}; sending SIGKILL",
                    if left.len() == 1 { "" } else { "s" },
                    left.join(", "),
                    grace.as_secs(),
                    signal_name(*sent)
                );
                signal_ranks(pgid, ranks, libc::SIGKILL);
                *killed = true;
            } else {
                sleep = sleep.min(*kill_at - now);
            }
        }

        // 4. Sleep until something happens.
        signals.wait(sleep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let exited3 = ExitStatus::from_raw(3 << 8);
        let killed9 = ExitStatus::from_raw(9);
        assert_eq!(exit_code_of(exited3), 3);
        assert_eq!(exit_code_of(killed9), 137);
        assert_eq!(
            describe_failure(2, exited3),
            "gwrun: rank 2 exited with status 3"
        );
        assert_eq!(
            describe_failure(1, killed9),
            "gwrun: rank 1 was killed by signal SIGKILL (9)"
        );
    }
}
