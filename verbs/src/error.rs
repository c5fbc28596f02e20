//! Every way the verbs layer fails, as one error type whose messages say what
//! to do about it.
//!
//! Verbs report failures as a bare errno, and the same errno means different
//! things from different calls (`ENOMEM` from `ibv_reg_mr` is usually the
//! locked-memory limit, from `ibv_create_qp` a queue too deep for the
//! device). So there is one variant per failing operation, each carrying the
//! verbs call's name and the errno, and the messages add the advice that
//! belongs to that call. This module is pure and built with or without the
//! `verbs` feature.

use std::fmt;

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// An errno as a verbs call returned or set it, printed as its text and
/// number ("Cannot allocate memory (errno 12)").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's `errno` now.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// The system's text for it, without the number ("Function not
    /// implemented").
    pub fn text(self) -> String {
        errno_text(self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.text(), self.0)
    }
}

/// The C library's text for `errno` (`strerror`), without the " (os error
/// N)" that `std::io::Error` appends.
pub fn errno_text(errno: i32) -> String {
    let full = std::io::Error::from_raw_os_error(errno).to_string();
    match full.rfind(" (os error ") {
        Some(at) => full[..at].to_string(),
        None => full,
    }
}

/// Why `ibv_reg_mr` may have failed with this errno, and what to check.
pub fn reg_mr_advice(errno: Errno) -> &'static str {
    match errno.0 {
        libc::EPERM | libc::ENOMEM => {
            "pinning memory needs a high enough locked-memory limit: check `ulimit -l` (unlimited, or at least the registered bytes) and, in a container, its memlock limit"
        }
        libc::EFAULT => "the range is not mapped in this process",
        libc::EINVAL => "the address, length or access flags are not acceptable to the device",
        _ => "see the device's kernel log (dmesg)",
    }
}

/// The verbs layer's failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This build has no verbs support.
    #[error("gradwire was built without the verbs feature: rebuild with --features verbs")]
    NotBuilt,

    /// `ibv_get_device_list` found nothing; `reason` is the system's
    /// (the errno text of the failed call, or "no devices found").
    #[error("no RDMA device: {reason}")]
    NoDevice { reason: String },

    /// `GW_IB_HCA` names a device that is not there.
    #[error("GW_IB_HCA={name}: no such RDMA device (found: {found})")]
    UnknownDevice { name: String, found: String },

    /// No port of the device can be used; `ports` lists each with its state.
    #[error("{device}: no usable port: {ports}")]
    NoActivePort { device: String, ports: String },

    /// A `GW_IB_*` variable has a value this crate cannot use.
    #[error("{var}={value}: {why}")]
    Config {
        var: &'static str,
        value: String,
        why: String,
    },

    /// `GW_IB_GID_INDEX` names an entry past the port's GID table.
    #[error(
        "GW_IB_GID_INDEX={index} is out of range: the port's GID table has {size} entries (0..{size})"
    )]
    GidIndexOutOfRange { index: u32, size: u32 },

    /// No entry of the GID table can carry this port's traffic.
    #[error("no usable GID: {why}")]
    NoGid { why: String },

    /// The GID table in sysfs could not be read.
    #[error("reading the GID table at {path}: {source}")]
    GidTable {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A peer's queue-pair endpoint did not decode.
    #[error("bad queue-pair endpoint: {0}")]
    BadEndpoint(String),

    /// A caller's argument is wrong (a range outside its region, a length
    /// a work request cannot carry).
    #[error("{0}")]
    InvalidArgument(String),

    /// Opening the device failed.
    #[error("{call} of {device} failed: {errno}")]
    OpenDevice {
        call: &'static str,
        device: String,
        errno: Errno,
    },

    /// Querying the device's attributes failed.
    #[error("{call} of {device} failed: {errno}")]
    QueryDevice {
        call: &'static str,
        device: String,
        errno: Errno,
    },

    /// Querying one of the device's ports failed.
    #[error("{call} of {device} port {port} failed: {errno}")]
    QueryPort {
        call: &'static str,
        device: String,
        port: u8,
        errno: Errno,
    },

    /// Allocating the protection domain failed.
    #[error("{call} failed: {errno}")]
    AllocPd { call: &'static str, errno: Errno },

    /// Registering memory failed.
    #[error("{call} of {len} bytes at {addr:#x} failed: {errno}: {advice}", advice = reg_mr_advice(*.errno))]
    RegMr {
        call: &'static str,
        addr: u64,
        len: usize,
        errno: Errno,
    },

    /// Creating the completion channel failed.
    #[error("{call} failed: {errno}")]
    CreateCompChannel { call: &'static str, errno: Errno },

    /// Creating a completion queue failed.
    #[error("{call} of {depth} entries failed: {errno}")]
    CreateCq {
        call: &'static str,
        depth: u32,
        errno: Errno,
    },

    /// Creating a shared receive queue failed.
    #[error("{call} of {depth} entries failed: {errno}")]
    CreateSrq {
        call: &'static str,
        depth: u32,
        errno: Errno,
    },

    /// Arming a completion queue, or reading its channel, failed.
    #[error("{call} failed: {errno}")]
    Notify { call: &'static str, errno: Errno },

    /// Creating a queue pair failed.
    #[error(
        "{call} failed: {errno} (send depth {send_depth}, receive depth {recv_depth}: ENOMEM or EINVAL here often means deeper queues than the device allows)"
    )]
    CreateQp {
        call: &'static str,
        send_depth: u32,
        recv_depth: u32,
        errno: Errno,
    },

    /// Moving a queue pair to its next state failed.
    #[error("{call} to {to} failed: {errno}{advice}", advice = modify_qp_advice(to, *.errno))]
    ModifyQp {
        call: &'static str,
        to: &'static str,
        errno: Errno,
    },

    /// Posting a send-queue work request failed.
    #[error(
        "{call} of work request {wr_id} failed: {errno} (ENOMEM: the send queue is full; wait for completions)"
    )]
    PostSend {
        call: &'static str,
        wr_id: u64,
        errno: Errno,
    },

    /// Posting a receive failed.
    #[error("{call} of work request {wr_id} failed: {errno} (ENOMEM: the receive queue is full)")]
    PostRecv {
        call: &'static str,
        wr_id: u64,
        errno: Errno,
    },

    /// Polling a completion queue failed.
    #[error("{call} failed: {errno}")]
    PollCq { call: &'static str, errno: Errno },

    /// A work request completed with an error status; `text` names the
    /// status and says what to check (see [`crate::status`]).
    #[error("work request {wr_id} failed: {text}")]
    Completion {
        wr_id: u64,
        status: u32,
        vendor_err: u32,
        text: String,
    },
}

fn modify_qp_advice(to: &str, errno: Errno) -> &'static str {
    match (to, errno.0) {
        ("RTR", libc::EINVAL) => {
            ": a path attribute was refused; check GW_IB_GID_INDEX (the GID must exist on this port) and the peer's endpoint"
        }
        ("RTR", libc::ETIMEDOUT) | ("RTR", libc::ENETUNREACH) => {
            ": no route to the peer's GID; check GW_IB_GID_INDEX and the peer's address"
        }
        _ => "",
    }
}

impl Error {
    /// The verbs call that failed, for variants that wrap one.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Error::OpenDevice { call, .. }
            | Error::QueryDevice { call, .. }
            | Error::QueryPort { call, .. }
            | Error::AllocPd { call, .. }
            | Error::RegMr { call, .. }
            | Error::CreateCompChannel { call, .. }
            | Error::CreateCq { call, .. }
            | Error::Notify { call, .. }
            | Error::CreateQp { call, .. }
            | Error::ModifyQp { call, .. }
            | Error::PostSend { call, .. }
            | Error::PostRecv { call, .. }
            | Error::PollCq { call, .. } => Some(call),
            _ => None,
        }
    }

    /// The errno of the failed call, for variants that wrap one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::OpenDevice { errno, .. }
            | Error::QueryDevice { errno, .. }
            | Error::QueryPort { errno, .. }
            | Error::AllocPd { errno, .. }
            | Error::RegMr { errno, .. }
            | Error::CreateCompChannel { errno, .. }
            | Error::CreateCq { errno, .. }
            | Error::Notify { errno, .. }
            | Error::CreateQp { errno, .. }
            | Error::ModifyQp { errno, .. }
            | Error::PostSend { errno, .. }
            | Error::PostRecv { errno, .. }
            | Error::PollCq { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_text_has_no_number() {
        assert_eq!(errno_text(libc::ENOSYS), "Function not implemented");
        assert_eq!(
            Errno(libc::ENOMEM).to_string(),
            "Cannot allocate memory (errno 12)"
        );
    }

    #[test]
    fn reg_mr_failures_point_at_the_memlock_limit() {
        for errno in [libc::EPERM, libc::ENOMEM] {
            let e = Error::RegMr {
                call: "ibv_reg_mr",
                addr: 0x1000,
                len: 4096,
                errno: Errno(errno),
            };
            let msg = e.to_string();
            assert!(msg.starts_with("ibv_reg_mr of 4096 bytes at 0x1000 failed: "));
            assert!(msg.contains("ulimit -l"), "{msg}");
            assert_eq!(e.call(), Some("ibv_reg_mr"));
            assert_eq!(e.errno(), Some(Errno(errno)));
        }
        let e = Error::RegMr {
            call: "ibv_reg_mr",
            addr: 0,
            len: 1,
            errno: Errno(libc::EFAULT),
        };
        assert!(!e.to_string().contains("ulimit"));
    }

    #[test]
    fn messages_name_the_call() {
        let e = Error::ModifyQp {
            call: "ibv_modify_qp",
            to: "RTR",
            errno: Errno(libc::EINVAL),
        };
        let msg = e.to_string();
        assert!(msg.starts_with("ibv_modify_qp to RTR failed: Invalid argument"));
        assert!(msg.contains("GW_IB_GID_INDEX"));
        let e = Error::ModifyQp {
            call: "ibv_modify_qp",
            to: "RTS",
            errno: Errno(libc::EINVAL),
        };
        assert_eq!(
            e.to_string(),
            "ibv_modify_qp to RTS failed: Invalid argument (errno 22)"
        );
        assert_eq!(
            Error::NoDevice {
                reason: "no devices found".into()
            }
            .to_string(),
            "no RDMA device: no devices found"
        );
        assert_eq!(Error::NotBuilt.call(), None);
    }

    #[test]
    fn the_stub_says_how_to_rebuild() {
        assert_eq!(
            Error::NotBuilt.to_string(),
            "gradwire was built without the verbs feature: rebuild with --features verbs"
        );
    }
}
