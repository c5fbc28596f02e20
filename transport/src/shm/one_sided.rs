//! One-sided writes between processes on one host: the writer stores bytes
//! straight into a region its peer published, with Linux cross-memory
//! attach (`process_vm_writev`), then tells the peer with an `Imm` frame.
//!
//! This is the shared-memory form of RDMA WRITE WITH IMM, so the persistent
//! operations and the one-sided protocol (`crate::rma`) run here exactly as
//! they will over a NIC: the region is registered and published once, a
//! write is one copy done by the kernel, and the immediate reaches the peer
//! through its ring after the bytes are in place (the ring's release store
//! orders them). A region's key is its owner's pid beside its index, so a
//! descriptor handed to the wrong rank is refused rather than written.
//!
//! One-sided reads (RDMA READ) are the same call the other way
//! (`process_vm_readv`), and need no frame: the reader alone takes part.
//!
//! The same rights as single-copy pulls are needed (see `pull.rs`): the
//! kernel refuses without ptrace rights over the peer, and the error then
//! says so.

use super::cma::{self, Dir, Stop};
use crate::error::{Error, Result};
use crate::seam::RemoteRegion;

/// The key of region `index` of the process `pid`.
pub(super) fn key(pid: u32, index: u32) -> u64 {
    (u64::from(pid) << 32) | u64::from(index)
}

/// The pid whose region `key` names.
pub(super) fn key_pid(key: u64) -> u32 {
    (key >> 32) as u32
}

/// Checks that `len` bytes at `offset` of `remote` lie inside it and that it
/// belongs to `peer`, the process `pid`; returns the address to copy at.
/// `what` names the operation in errors (`write_imm`, `read`).
pub(super) fn target(
    what: &str,
    remote: &RemoteRegion,
    peer: u32,
    pid: u32,
    offset: u64,
    len: usize,
) -> Result<u64> {
    if remote.rank != peer {
        return Err(Error::InvalidArgument(format!(
            "{what} of rank {peer} with a region rank {} published",
            remote.rank
        )));
    }
    if key_pid(remote.key) != pid {
        return Err(Error::InvalidArgument(format!(
            "{what} of rank {peer}: the region's key {:#x} is of process {}, but rank {peer} is process {pid} (a stale or foreign descriptor)",
            remote.key,
            key_pid(remote.key)
        )));
    }
    if offset
        .checked_add(len as u64)
        .is_none_or(|end| end > remote.len)
    {
        return Err(Error::InvalidArgument(format!(
            "{what} of rank {peer}: [{offset}, {offset}+{len}) lies outside its published region of {} bytes",
            remote.len
        )));
    }
    remote.addr.checked_add(offset).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} of rank {peer}: address {:#x} + {offset} overflows",
            remote.addr
        ))
    })
}

/// Copies `len` bytes between `local` in this process and `addr` in
/// process `pid`, the way `dir` says (`cma.rs`); `who` names the peer in
/// errors (formatted only then).
///
/// # Safety
/// `local..local + len` must be memory of this process for the call,
/// readable for a write and writable (and not otherwise borrowed) for a
/// read.
pub(super) unsafe fn copy(
    dir: Dir,
    local: *mut u8,
    len: usize,
    pid: u32,
    addr: u64,
    who: &dyn Fn() -> String,
) -> Result<()> {
    let (syscall, what, into) = match dir {
        Dir::Write => ("process_vm_writev", "write", "into"),
        Dir::Read => ("process_vm_readv", "read", "from"),
    };
    // SAFETY: forwarded from the caller.
    unsafe { cma::copy(dir, pid as libc::pid_t, local, addr, len) }.map_err(|s| match s.why {
        Stop::Os(source) => {
            let hint = match source.raw_os_error() {
                Some(libc::EPERM) => {
                    ": this process may not reach into the peer's memory (ptrace rights are needed: same user, Yama ptrace_scope <= 1, no seccomp filter)"
                }
                Some(libc::ESRCH) => ": the peer's process is gone",
                Some(libc::EFAULT) => {
                    ": the peer's region is not mapped (freed after it was published?)"
                }
                _ => "",
            };
            Error::Sys {
                syscall,
                context: format!(
                    "one-sided {what} of {} bytes at {:#x} {into} {}{hint}",
                    s.left,
                    s.at,
                    who()
                ),
                source,
            }
        }
        Stop::Nothing => Error::Protocol(format!(
            "{syscall} {into} {} moved nothing at {:#x}",
            who(),
            s.at
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::near;

    fn region(rank: u32, pid: u32, len: u64) -> RemoteRegion {
        RemoteRegion {
            rank,
            key: key(pid, 3),
            addr: 0x1000,
            len,
        }
    }

    #[test]
    fn targets_are_checked_against_rank_pid_and_bounds() {
        assert_eq!(
            target("write_imm", &region(1, 50, 100), 1, 50, 10, 90).unwrap(),
            0x100a
        );
        let e = target("write_imm", &region(2, 50, 100), 1, 50, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 2 published"), "{e}");
        let e = target("write_imm", &region(1, 51, 100), 1, 50, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("process 51") && e.contains("process 50"), "{e}");
        let e = target("write_imm", &region(1, 50, 100), 1, 50, 10, 91)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside"), "{e}");
        assert!(target("write_imm", &region(1, 50, 100), 1, 50, u64::MAX, 1).is_err());
    }

    #[test]
    fn a_write_into_a_gone_process_names_the_cause() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let b = [1u8; 8];
        // SAFETY: `b` is readable for the call.
        let e = unsafe {
            copy(Dir::Write, b.as_ptr().cast_mut(), 8, pid, 0x1000, &|| {
                "rank 9".into()
            })
        }
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("process_vm_writev") && e.contains("rank 9"),
            "{e}"
        );
    }

    #[test]
    fn writes_and_reads_just_past_their_source_go_through_the_bounce() {
        // This process as the peer: several bounce chunks and a ragged
        // end, the destination 16 bytes past the source modulo a page
        // (`near.rs`) each way, then a pair that is not near.
        let me = std::process::id();
        let len = 2 * near::BOUNCE_CHUNK + 1000;
        let src: Vec<u8> = (0..len).map(|i| (i * 11 + 1) as u8).collect();
        for dist in [16usize, 200] {
            let mut far = vec![0u8; len + 8192];
            let s = src.as_ptr() as usize;
            let off = (s + dist).wrapping_sub(far.as_ptr() as usize) & 4095;
            let there = far.as_mut_ptr().wrapping_add(off) as u64;
            assert_eq!(near::near(there as usize, s, len), dist == 16);
            // SAFETY: src is readable for len bytes; `there` is len bytes
            // of `far`, in this process.
            unsafe {
                copy(Dir::Write, src.as_ptr().cast_mut(), len, me, there, &|| {
                    "me".into()
                })
            }
            .unwrap();
            assert!(far[off..off + len] == src[..], "write at distance {dist}");
            assert!(far[..off].iter().chain(&far[off + len..]).all(|&b| b == 0));
            // And back: a read whose destination is `dist` past its source.
            let mut back = vec![0u8; len + 8192];
            let b_off = (there as usize + dist).wrapping_sub(back.as_ptr() as usize) & 4095;
            assert_eq!(
                near::near(back.as_ptr() as usize + b_off, there as usize, len),
                dist == 16
            );
            // SAFETY: `back` holds b_off + len writable bytes.
            unsafe {
                copy(
                    Dir::Read,
                    back.as_mut_ptr().add(b_off),
                    len,
                    me,
                    there,
                    &|| "me".into(),
                )
            }
            .unwrap();
            assert!(
                back[b_off..b_off + len] == src[..],
                "read at distance {dist}"
            );
            assert!(
                back[..b_off]
                    .iter()
                    .chain(&back[b_off + len..])
                    .all(|&b| b == 0)
            );
        }
        // A failure through the bounce still names the call and the peer.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        // SAFETY: src is readable for 4096 bytes.
        let e = unsafe {
            copy(
                Dir::Write,
                src.as_ptr().cast_mut(),
                4096,
                gone,
                src.as_ptr() as u64 + 16,
                &|| "rank 9".into(),
            )
        }
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("process_vm_writev") && e.contains("rank 9"),
            "{e}"
        );
    }
}
