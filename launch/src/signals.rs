//! SIGINT, SIGTERM and SIGCHLD for the supervising thread, without races.
//!
//! The classic `pselect` pattern: the three signals stay blocked in gwrun all
//! the time, except atomically inside [`Signals::wait`] (`ppoll` with a mask
//! that lets them through). So
//! - a rank that exits, or a Ctrl-C, between two checks of the supervisor loop
//!   is still pending when it next waits and wakes it at once (no lost wakeup,
//!   no polling interval);
//! - the handler can only run on the supervising thread while it sits in
//!   `ppoll`. Threads started afterwards (the output forwarders, the store's)
//!   inherit the blocked mask and never see `EINTR` from these signals.
//!
//! The handler only bumps atomics. Children get a clean mask and default
//! dispositions from `std::process::Command` and exec.

use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

static TERMINATE_COUNT: AtomicU32 = AtomicU32::new(0);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD];

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGINT || sig == libc::SIGTERM {
        LAST_SIGNAL.store(sig, Ordering::SeqCst);
        TERMINATE_COUNT.fetch_add(1, Ordering::SeqCst);
    }
    // SIGCHLD needs no bookkeeping: interrupting ppoll is the point.
}

/// Installed signal handling; dropping it restores the previous mask and
/// handlers.
pub struct Signals {
    old_mask: libc::sigset_t,
    wait_mask: libc::sigset_t,
    old_actions: Vec<(libc::c_int, libc::sigaction)>,
    seen: u32,
}

impl Signals {
    /// Blocks SIGINT/SIGTERM/SIGCHLD on the calling thread and installs the
    /// handler. Call before starting any other thread or child.
    pub fn install() -> io::Result<Signals> {
        // SAFETY: plain libc calls on properly initialised local sigset_t and
        // sigaction values; the handler is async-signal-safe (atomics only).
        unsafe {
            let mut block = MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(block.as_mut_ptr());
            let mut block = block.assume_init();
            for s in HANDLED {
                libc::sigaddset(&mut block, s);
            }
            let mut old_mask = MaybeUninit::<libc::sigset_t>::uninit();
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &block, old_mask.as_mut_ptr());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            let old_mask = old_mask.assume_init();
            let mut wait_mask = old_mask;
            for s in HANDLED {
                libc::sigdelset(&mut wait_mask, s);
            }

            let mut this = Signals {
                old_mask,
                wait_mask,
                old_actions: Vec::new(),
                seen: TERMINATE_COUNT.load(Ordering::SeqCst),
            };
            for s in HANDLED {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART
                    | if s == libc::SIGCHLD {
                        libc::SA_NOCLDSTOP
                    } else {
                        0
                    };
                libc::sigemptyset(&mut sa.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(s, &sa, &mut old) != 0 {
                    return Err(io::Error::last_os_error()); // Drop restores what was done
                }
                this.old_actions.push((s, old));
            }
            Ok(this)
        }
    }

    /// Sleeps until a handled signal arrives (or one is already pending) or
    /// `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: no fds (null pointer with count 0), valid timespec and mask.
        unsafe {
            libc::ppoll(std::ptr::null_mut(), 0, &ts, &self.wait_mask);
        }
    }

    /// SIGINT/SIGTERM received since the last call: how many, and the last one.
    pub fn take_terminate(&mut self) -> Option<(u32, libc::c_int)> {
        let now = TERMINATE_COUNT.load(Ordering::SeqCst);
        let new = now.wrapping_sub(self.seen);
        self.seen = now;
        (new > 0).then(|| (new, LAST_SIGNAL.load(Ordering::SeqCst)))
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restores values previously returned by the kernel. The mask
        // goes first so that anything pending runs our harmless handler.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
            for (s, old) in &self.old_actions {
                libc::sigaction(*s, old, std::ptr::null_mut());
            }
        }
    }
}

/// `SIGTERM`-style name of a signal number (`SIG?` for unknown ones).
pub fn signal_name(sig: libc::c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => {
            let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
            if (min..=max).contains(&sig) {
                return format!("SIGRTMIN+{}", sig - min);
            }
            return "SIG?".to_owned();
        }
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
        assert_eq!(signal_name(1000), "SIG?");
    }
}
