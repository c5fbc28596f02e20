//! One error type for the whole data plane.
//!
//! Errors carry what a user needs to act: the failing syscall, the remote
//! address, the rank on the other side, and what this rank was doing. The
//! variants map one-to-one onto the C ABI's result codes (see `capi/`).

use std::io;

/// Result alias used throughout gradwire.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while moving bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed something unusable (bad length, count overflow, unknown enum).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The call is valid in isolation but not now (destroyed communicator, wrong state).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A system call failed.
    #[error("{syscall} failed ({context}): {source}")]
    Sys {
        syscall: &'static str,
        context: String,
        #[source]
        source: io::Error,
    },
    /// The peer closed or reset a connection, died, or reported an error of its own.
    #[error("rank {rank} ({addr}): {what}")]
    Remote {
        rank: u32,
        addr: String,
        what: String,
    },
    /// The two sides of a transfer disagree about the operation.
    #[error(
        "operation mismatch with rank {peer}: this rank (rank {me}) is in {local}, rank {peer} sent {remote}"
    )]
    Mismatch {
        me: u32,
        peer: u32,
        local: String,
        remote: String,
    },
    /// A deadline passed.
    #[error("timed out after {secs:.1}s {what}")]
    Timeout { secs: f64, what: String },
    /// The communicator was aborted (locally or because a peer failed).
    #[error("aborted: {0}")]
    Aborted(String),
    /// A peer sent bytes that do not decode.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The rendezvous store refused or failed a request.
    #[error("store: {0}")]
    Store(String),
    /// Configuration could not be parsed or is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// A bug in gradwire.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Wraps an `io::Error` with the syscall that produced it and its context.
    pub fn sys(syscall: &'static str, context: impl Into<String>, source: io::Error) -> Self {
        Error::Sys {
            syscall,
            context: context.into(),
            source,
        }
    }

    /// Wraps the current `errno`.
    pub fn last_os(syscall: &'static str, context: impl Into<String>) -> Self {
        Self::sys(syscall, context, io::Error::last_os_error())
    }

    /// Whether this error came from another rank rather than from this one.
    pub fn is_remote(&self) -> bool {
        matches!(self, Error::Remote { .. } | Error::Mismatch { .. })
    }
}

impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::InvalidUsage(s) => Error::InvalidUsage(s.clone()),
            Error::Sys {
                syscall,
                context,
                source,
            } => Error::Sys {
                syscall,
                context: context.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::Remote { rank, addr, what } => Error::Remote {
                rank: *rank,
                addr: addr.clone(),
                what: what.clone(),
            },
            Error::Mismatch {
                me,
                peer,
                local,
                remote,
            } => Error::Mismatch {
                me: *me,
                peer: *peer,
                local: local.clone(),
                remote: remote.clone(),
            },
            Error::Timeout { secs, what } => Error::Timeout {
                secs: *secs,
                what: what.clone(),
            },
            Error::Aborted(s) => Error::Aborted(s.clone()),
            Error::Protocol(s) => Error::Protocol(s.clone()),
            Error::Store(s) => Error::Store(s.clone()),
            Error::Config(s) => Error::Config(s.clone()),
            Error::Internal(s) => Error::Internal(s.clone()),
        }
    }
}

/// Bring-up errors keep their variant, so their message and C result code
/// are the same whichever layer reports them.
impl From<gw_rendezvous::Error> for Error {
    fn from(e: gw_rendezvous::Error) -> Self {
        use gw_rendezvous::Error as R;
        match e {
            R::InvalidArgument(s) => Error::InvalidArgument(s),
            R::Sys {
                syscall,
                context,
                source,
            } => Error::Sys {
                syscall,
                context,
                source,
            },
            R::Timeout { secs, what } => Error::Timeout { secs, what },
            R::Protocol(s) => Error::Protocol(s),
            R::Store(s) => Error::Store(s),
            R::Config(s) => Error::Config(s),
        }
    }
}
