//! What can go wrong, one variant per failing operation.
//!
//! Each variant that comes from a libfabric call carries a [`FiCall`]: the
//! call's name, the negative errno it returned and `fi_strerror`'s text, so
//! a message names what failed without the reader knowing the binding.
//! `-FI_EAGAIN` from a data call is not a failure but [`Error::Again`]:
//! the caller must progress (read the completion queue) and post again.

use std::fmt;

/// A libfabric call that returned a negative errno.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FiCall {
    /// The libfabric function, such as `"fi_getinfo"`.
    pub call: &'static str,
    /// What it returned: a negative `FI_E*` value.
    pub errno: i32,
    /// `fi_strerror(-errno)`.
    pub text: String,
}

impl fmt::Display for FiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {} ({})", self.call, self.errno, self.text)
    }
}

/// Errors of the libfabric binding.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// libfabric.so.1 could not be loaded at run time.
    #[error("libfabric not found ({0}): install libfabric1")]
    NotFound(String),
    /// The crate was compiled where `rdma/fabric.h` was absent.
    #[error("gradwire was built without libfabric headers: install libfabric-dev and rebuild")]
    NotBuilt,
    /// No provider of that name is present (or none for an RDM endpoint).
    #[error("libfabric provider {wanted:?} is not available; available providers: {}", list(.available))]
    UnknownProvider {
        /// The name asked for.
        wanted: String,
        /// Distinct `prov_name`s that fi_getinfo lists with no filter.
        available: Vec<String>,
    },
    /// The provider is present but cannot do what gradwire needs.
    #[error("libfabric provider {provider} lacks {missing}")]
    MissingCapability {
        /// The provider's name.
        provider: String,
        /// What it lacks, such as `"FI_RMA"` or `"cq_data_size >= 4 (it has 0)"`.
        missing: String,
    },
    /// With no provider named, none of the preferred ones is usable.
    #[error("no usable libfabric provider: {0}")]
    NoProvider(String),
    /// fi_getinfo failed for a reason other than "no match".
    #[error("querying libfabric providers failed: {0}")]
    GetInfo(FiCall),
    /// fi_fabric.
    #[error("opening the {provider} fabric failed: {call}")]
    Fabric {
        /// The provider's name.
        provider: String,
        /// The failing call.
        call: FiCall,
    },
    /// fi_domain.
    #[error("opening the {provider} domain failed: {call}")]
    Domain {
        /// The provider's name.
        provider: String,
        /// The failing call.
        call: FiCall,
    },
    /// fi_cq_open or fi_control(FI_GETWAIT).
    #[error("opening the completion queue failed: {0}")]
    Cq(FiCall),
    /// fi_av_open.
    #[error("opening the address vector failed: {0}")]
    Av(FiCall),
    /// fi_endpoint, fi_ep_bind or fi_enable.
    #[error("opening the endpoint failed: {0}")]
    Endpoint(FiCall),
    /// fi_getname.
    #[error("reading the endpoint's name failed: {0}")]
    GetName(FiCall),
    /// fi_av_insert.
    #[error("inserting a peer address ({len} bytes) failed: {call}")]
    AvInsert {
        /// Length of the name given.
        len: usize,
        /// The failing call.
        call: FiCall,
    },
    /// fi_mr_reg, fi_mr_bind or fi_mr_enable, or a key it could not give.
    #[error("registering {len} bytes at {addr:#x} failed: {call}{}", ulimit_hint(.call.errno))]
    Register {
        /// Start of the range.
        addr: usize,
        /// Its length.
        len: usize,
        /// The failing call.
        call: FiCall,
    },
    /// A data call (fi_send, fi_inject, fi_recv, fi_write, fi_writedata,
    /// fi_read) refused the operation.
    #[error("posting failed: {0}")]
    Post(FiCall),
    /// The provider has no room now (`-FI_EAGAIN`, or every operation
    /// context in use): read completions and post again.
    #[error("libfabric has no room for the operation now: progress and retry")]
    Again,
    /// fi_cq_read, fi_cq_readerr or fi_trywait failed.
    #[error("reading the completion queue failed: {0}")]
    CqRead(FiCall),
    /// An operation completed with an error (fi_cq_readerr).
    #[error(
        "operation {} failed: error {errno} ({text}), provider error {prov_errno} ({prov_text})",
        ctx.map_or_else(|| "without context".to_owned(), |c| format!("with context {c:#x}"))
    )]
    Completion {
        /// The caller's context of the failed operation, if it had one.
        ctx: Option<u64>,
        /// The completion's flags.
        flags: u64,
        /// The error: a positive `FI_E*` value (shm in libfabric 1.17
        /// reports it negated; it is made positive here).
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
        /// The provider's own error number.
        prov_errno: i32,
        /// `fi_cq_strerror`'s text for the provider's error.
        prov_text: String,
    },
    /// The binding was used in a way libfabric would refuse.
    #[error("{0}")]
    Usage(String),
}

/// Results of the binding.
pub type Result<T> = std::result::Result<T, Error>;

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Registration refusals that mean "out of lockable memory" on Linux.
fn ulimit_hint(errno: i32) -> &'static str {
    const ENOMEM: i32 = 12;
    const EFAULT: i32 = 14;
    const EPERM: i32 = 1;
    const EACCES: i32 = 13;
    match -errno {
        ENOMEM | EFAULT | EPERM | EACCES => {
            "; check `ulimit -l` (the locked-memory limit) for the user running this process"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_refusals_point_at_ulimit() {
        for errno in [-12, -14, -1, -13] {
            let e = Error::Register {
                addr: 0x1000,
                len: 4096,
                call: FiCall {
                    call: "fi_mr_reg",
                    errno,
                    text: "x".into(),
                },
            };
            assert!(e.to_string().contains("ulimit -l"), "{e}");
        }
        let e = Error::Register {
            addr: 0x1000,
            len: 4096,
            call: FiCall {
                call: "fi_mr_reg",
                errno: -22,
                text: "Invalid argument".into(),
            },
        };
        assert!(!e.to_string().contains("ulimit"), "{e}");
        assert!(
            e.to_string()
                .contains("fi_mr_reg returned -22 (Invalid argument)"),
            "{e}"
        );
    }

    #[test]
    fn unknown_provider_lists_the_others() {
        let e = Error::UnknownProvider {
            wanted: "nosuch".into(),
            available: vec!["tcp;ofi_rxm".into(), "shm".into()],
        };
        assert_eq!(
            e.to_string(),
            "libfabric provider \"nosuch\" is not available; available providers: tcp;ofi_rxm, shm"
        );
    }
}
