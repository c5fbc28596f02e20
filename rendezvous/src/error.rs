//! The errors of bring-up: reaching the store, the store refusing, and
//! launch variables that do not describe a job.
//!
//! The transport's error type converts from this one variant for variant, so
//! a rank sees the same message and the C ABI the same result code whether a
//! failure happened during bring-up or later.

use std::io;

/// Result alias of the rendezvous layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while ranks find each other.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed something unusable (an empty key, an oversized limit).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A system call failed.
    #[error("{syscall} failed ({context}): {source}")]
    Sys {
        syscall: &'static str,
        context: String,
        #[source]
        source: io::Error,
    },
    /// A deadline passed.
    #[error("timed out after {secs:.1}s {what}")]
    Timeout { secs: f64, what: String },
    /// A peer sent bytes that do not decode.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The store refused or failed a request.
    #[error("store: {0}")]
    Store(String),
    /// The launch variables are missing or inconsistent.
    #[error("configuration: {0}")]
    Config(String),
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
}

// `io::Error` is not `Clone`; a decoder that failed once repeats its error
// to every later call, so the error keeps the kind and the message.
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Sys {
                syscall,
                context,
                source,
            } => Error::Sys {
                syscall,
                context: context.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::Timeout { secs, what } => Error::Timeout {
                secs: *secs,
                what: what.clone(),
            },
            Error::Protocol(s) => Error::Protocol(s.clone()),
            Error::Store(s) => Error::Store(s.clone()),
            Error::Config(s) => Error::Config(s.clone()),
        }
    }
}
