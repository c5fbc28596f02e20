//! The kernel's copy between this process and another one on the host
//! (Linux cross-memory attach: `process_vm_readv` / `process_vm_writev`),
//! for the pulls of `pull.rs` and the one-sided writes and reads of
//! `one_sided.rs`. Both need the same loop over short copies and the same
//! way around `rep movsb` for buffers that meet just past each other
//! (`near.rs`); each turns a failure into its own error.

use super::near;
use std::io;

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    /// From this process into the other's memory (`process_vm_writev`).
    Write,
    /// From the other's memory into this process (`process_vm_readv`).
    Read,
}

/// Why a copy stopped, and where: the remote address it had reached and
/// the bytes left of the call that failed.
#[derive(Debug)]
pub(super) struct Stopped {
    pub at: u64,
    pub left: usize,
    pub why: Stop,
}

#[derive(Debug)]
pub(super) enum Stop {
    /// The system call failed.
    Os(io::Error),
    /// It moved nothing, which it never should.
    Nothing,
}

/// Copies `len` bytes between `local` and `addr` in process `pid`, the way
/// `dir` says; where the destination lies just past the source modulo a
/// page, through this thread's bounce buffer (see `near.rs`).
///
/// # Safety
/// `local..local + len` must be memory of this process for the call,
/// readable for a write and writable (and not otherwise accessed) for a
/// read.
pub(super) unsafe fn copy(
    dir: Dir,
    pid: libc::pid_t,
    local: *mut u8,
    addr: u64,
    len: usize,
) -> Result<(), Stopped> {
    let (dst, src) = match dir {
        Dir::Write => (addr as usize, local as usize),
        Dir::Read => (local as usize, addr as usize),
    };
    if near::near(dst, src, len) {
        // The kernel's copy between the other's memory and a bounce buffer
        // at the same offset in a page, ours between the bounce and `local`.
        let bounced = near::bounced(addr, len, |at, done, bounce, n| {
            // SAFETY: `bounce` is n bytes of this thread's bounce buffer,
            // and `local` holds len >= done + n bytes (the caller's
            // promise), distinct from it.
            unsafe {
                match dir {
                    Dir::Write => {
                        near::copy(bounce, local.add(done), n);
                        copy_direct(dir, pid, bounce, at, n)
                    }
                    Dir::Read => {
                        copy_direct(dir, pid, bounce, at, n)?;
                        near::copy(local.add(done), bounce, n);
                        Ok(())
                    }
                }
            }
        });
        // None: the bounce buffer is gone (a thread-local destructor);
        // copy directly, slowly but correctly.
        if let Some(r) = bounced {
            return r;
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { copy_direct(dir, pid, local, addr, len) }
}

/// [`copy`] with the kernel's copy straight between `local` and `addr`, in
/// as many calls as short copies take.
///
/// # Safety
/// As for [`copy`].
unsafe fn copy_direct(
    dir: Dir,
    pid: libc::pid_t,
    local: *mut u8,
    addr: u64,
    len: usize,
) -> Result<(), Stopped> {
    let mut done = 0usize;
    while done < len {
        let here = libc::iovec {
            iov_base: local.wrapping_add(done).cast::<libc::c_void>(),
            iov_len: len - done,
        };
        let there = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local range is valid (the caller's promise); the
        // remote range is checked by the kernel, which fails rather than
        // touching memory the other process has not mapped.
        let n = unsafe {
            match dir {
                Dir::Write => libc::process_vm_writev(pid, &here, 1, &there, 1, 0),
                Dir::Read => libc::process_vm_readv(pid, &here, 1, &there, 1, 0),
            }
        };
        if n <= 0 {
            return Err(Stopped {
                at: addr.wrapping_add(done as u64),
                left: len - done,
                why: if n < 0 {
                    Stop::Os(io::Error::last_os_error())
                } else {
                    Stop::Nothing
                },
            });
        }
        done += n as usize;
    }
    Ok(())
}
