//! Single-copy transfers: the receiver copies a message straight out of the
//! sender's process with Linux cross-memory attach (`process_vm_readv`).
//!
//! Through the slot rings every byte is copied twice, into a slot by the
//! sender and out of it by the receiver; for large messages those two copies
//! are most of an all-reduce's time (a 64 MiB shm all-reduce spent 71% of its
//! cycles in memmove). A message of at least the pull threshold therefore
//! travels as one small [`FrameKind::Rendezvous`](crate::wire::FrameKind)
//! frame carrying its address in the sender's process and a completion
//! number `k`; the receiver, once a matching receive is posted, copies the
//! bytes with one `process_vm_readv` (one copy, done by the kernel) and
//! reports `k` in the ring's `done` array (see `ring.rs`), after which the
//! sender's request completes and its memory may be reused.
//!
//! Whether the receiver may read the sender's memory is found out once per
//! ring, not assumed: the kernel refuses without ptrace rights (another user,
//! Yama's `ptrace_scope` >= 2, a seccomp filter as in default container
//! profiles). The sender publishes the address of a probe word that holds its
//! own address; the receiver reads it from the sender's process and records
//! yes or no in the ring, and the sender uses rendezvous frames only after a
//! yes. Under Yama's `ptrace_scope` = 1 each process allows its peers to read
//! it (`PR_SET_PTRACER`), as OpenMPI's shared-memory transport does.

use super::cma::{self, Dir, Stop};
use std::io;
use std::sync::Once;

/// Bytes of a rendezvous frame's payload: address, then completion number.
pub(crate) const RENDEZVOUS_LEN: usize = 16;

/// Encodes a rendezvous payload.
pub(crate) fn encode(addr: u64, k: u64) -> [u8; RENDEZVOUS_LEN] {
    let mut b = [0u8; RENDEZVOUS_LEN];
    b[..8].copy_from_slice(&addr.to_le_bytes());
    b[8..].copy_from_slice(&k.to_le_bytes());
    b
}

/// Decodes a rendezvous payload into (address, completion number).
pub(crate) fn decode(b: &[u8; RENDEZVOUS_LEN]) -> (u64, u64) {
    let mut a = [0u8; 8];
    let mut k = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    k.copy_from_slice(&b[8..]);
    (u64::from_le_bytes(a), u64::from_le_bytes(k))
}

/// Under Yama `ptrace_scope` = 1 only ancestors may read a process; lets any
/// process of this user do it instead (other users and scope >= 2 stay
/// refused). Done once per process.
pub(crate) fn allow_peers_to_pull() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
        if scope.is_ok_and(|s| s.trim() == "1") {
            // SAFETY: prctl with PR_SET_PTRACER takes a plain integer argument.
            let rc = unsafe {
                libc::prctl(
                    libc::PR_SET_PTRACER,
                    libc::PR_SET_PTRACER_ANY,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                )
            };
            if rc != 0 {
                tracing::info!(
                    "shm: prctl(PR_SET_PTRACER) failed ({}); peers copy through slots",
                    io::Error::last_os_error()
                );
            }
        }
    });
}

/// Copies `len` bytes at `remote` in process `pid` to `dst`, looping over
/// short reads, around `rep movsb` where `dst` lies just past `remote`
/// modulo a page (`cma.rs`).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes and not otherwise accessed
/// during the call.
pub(crate) unsafe fn pull(pid: u32, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: forwarded from the caller.
    unsafe { cma::copy(Dir::Read, pid, dst, remote, len) }.map_err(|s| match s.why {
        Stop::Os(e) => e,
        Stop::Nothing => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read 0 of {} remaining bytes", s.left),
        ),
    })
}

/// Whether this process can read process `pid`'s memory: reads the probe
/// word at `addr`, which holds its own address there.
pub(crate) fn probe(pid: u32, addr: u64) -> bool {
    if addr == 0 {
        return false;
    }
    let mut word = [0u8; 8];
    // SAFETY: `word` is a local buffer of 8 bytes.
    let ok = unsafe { pull(pid, addr, word.as_mut_ptr(), 8) };
    matches!(ok, Ok(())) && u64::from_le_bytes(word) == addr
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::near;

    #[test]
    fn payload_roundtrips() {
        assert_eq!(
            decode(&encode(0xdead_beef_0000_1234, 77)),
            (0xdead_beef_0000_1234, 77)
        );
    }

    #[test]
    fn pulls_from_this_process_and_probes_its_own_word() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: dst is a live buffer of src.len() bytes.
        unsafe {
            pull(
                std::process::id(),
                src.as_ptr() as u64,
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
        .expect("process_vm_readv of our own memory");
        assert_eq!(src, dst);
        // The probe word must hold its own address: one holding 0 fails.
        let zero = Box::new(0u64);
        assert!(!probe(std::process::id(), &*zero as *const u64 as u64));
        let mut own = Box::new(0u64);
        *own = &*own as *const u64 as u64;
        assert!(probe(std::process::id(), *own));
    }

    #[test]
    fn a_destination_just_past_its_source_is_pulled_through_the_bounce() {
        // Several bounce chunks and a ragged end, the destination 16 bytes
        // past the source modulo a page (`near.rs`), and one that is not.
        let len = 2 * near::BOUNCE_CHUNK + 4097;
        let src: Vec<u8> = (0..len + 4096).map(|i| (i * 13 + 5) as u8).collect();
        for dist in [16usize, 100] {
            let mut dst = vec![0u8; len + 8192];
            let s = src.as_ptr() as usize;
            let off = (s + dist).wrapping_sub(dst.as_ptr() as usize) & 4095;
            assert_eq!(near::near(dst.as_ptr() as usize + off, s, len), dist == 16);
            // SAFETY: dst holds off + len bytes.
            unsafe { pull(std::process::id(), s as u64, dst.as_mut_ptr().add(off), len) }
                .expect("process_vm_readv of our own memory");
            assert!(dst[off..off + len] == src[..len], "distance {dist}");
            assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&b| b == 0));
        }
    }

    #[test]
    fn a_bad_address_or_pid_is_an_error_not_a_crash() {
        let mut dst = [0u8; 16];
        // SAFETY: dst is a live 16-byte buffer.
        let e = unsafe { pull(std::process::id(), 8, dst.as_mut_ptr(), 16) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        assert!(!probe(u32::MAX - 1, 4096));
        assert!(!probe(std::process::id(), 0));
    }
}
