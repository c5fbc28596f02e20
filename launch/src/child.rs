//! Starting a rank so that its launcher can always clean up after it.
//!
//! gwrun and the job server's agent start ranks the same way:
//! - each rank asks the kernel for SIGKILL when its launcher dies
//!   (`PR_SET_PDEATHSIG`), so a `kill -9` of the launcher leaves no orphans;
//! - SIGINT/SIGTERM are reset to their default action and the signal mask
//!   cleared, because a launcher started with them ignored (`nohup`, a
//!   background job of a script) or blocked (see [`crate::signals`]) would
//!   otherwise pass that on and make forwarding useless;
//! - stdin is /dev/null: the ranks are not in the terminal's foreground
//!   group, and a read from the terminal would stop them with SIGTTIN;
//! - the rank leads or joins a process group, so one `kill(-pgid)` reaches
//!   it *and* whatever it forked (`sh -c` children, data loaders), which
//!   would otherwise keep running and hold the launcher's output pipes.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Which process group a rank goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// A new group, led by the rank.
    New,
    /// The group of an earlier rank (its pgid).
    Join(i32),
}

/// Sets `cmd` up as every gradwire launcher starts a rank (see the module
/// comment). Output redirection and the environment are the caller's.
pub fn prepare(cmd: &mut Command, group: Group) {
    cmd.stdin(Stdio::null());
    cmd.process_group(match group {
        Group::New => 0,
        Group::Join(pgid) => pgid,
    });
    // SAFETY: getpid is always safe to call.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only async-signal-safe functions (prctl, getppid, signal, sigemptyset,
    // sigprocmask, _exit) on a local sigset_t; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The launcher died before the prctl took effect: nobody will
            // signal us.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            reset_signals_in_child()
        });
    }
}

/// Gives a forked child default signal handling before it execs: gwrun and
/// the agent block SIGINT/SIGTERM/SIGCHLD on their main thread (see
/// [`crate::signals`]) and a fork keeps that mask across exec, so without
/// this a rank would never see the SIGTERM that is meant to stop it.
///
/// # Safety
/// Call only between fork and exec (in `pre_exec`): it uses only
/// async-signal-safe calls.
pub unsafe fn reset_signals_in_child() -> io::Result<()> {
    // SAFETY: plain libc calls on a local sigset, valid in a forked child.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        let mut none = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(none.as_mut_ptr());
        if libc::sigprocmask(libc::SIG_SETMASK, none.as_ptr(), std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
