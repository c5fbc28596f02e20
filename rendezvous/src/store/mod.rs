//! The rendezvous store: a small TCP key-value store for bringing a job up.
//!
//! Before any transport exists, ranks need somewhere to publish their
//! addresses, count arrivals and notice a rank started twice. Like torch's
//! `TCPStore`, one process (the launcher, or rank 0) runs a [`StoreServer`] and
//! every rank talks to it through a blocking [`StoreClient`]. The store is
//! authenticated by the per-job token (`GW_TOKEN`) so that a rank of another
//! job, or a port scanner, cannot join or poison it, and every call has a
//! deadline so that a missing rank is an error that names what is missing,
//! never a hang.
//!
//! The wire format lives in [`codec`] (pure, no I/O); [`server`] and [`client`]
//! are thin socket drivers around it.

mod admission;
pub mod client;
pub mod codec;
pub mod server;

pub use client::StoreClient;
pub use codec::Limits;
pub use server::StoreServer;

use crate::error::{Error, Result};
use std::time::Duration;

/// Server-side limits of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Longest value accepted by `set` (default 16 MiB).
    pub max_value_bytes: usize,
    /// Longest key (default 4096 bytes).
    pub max_key_bytes: usize,
    /// How long a new connection may take to present the job token (default
    /// 10 s): the whole Hello must arrive by then, however it is trickled.
    pub auth_timeout: Duration,
    /// Most connections open at once, authenticated or not (default 16384);
    /// each costs a thread and a descriptor.
    pub max_connections: usize,
    /// Most connections from one IP address that have not yet presented the
    /// job token (default 64), so one host cannot hold every slot open.
    pub max_unauthenticated_per_ip: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        let l = Limits::default();
        StoreConfig {
            max_value_bytes: l.max_value_bytes,
            max_key_bytes: l.max_key_bytes,
            auth_timeout: Duration::from_secs(10),
            max_connections: 16384,
            max_unauthenticated_per_ip: 64,
        }
    }
}

impl StoreConfig {
    /// The caps the codec enforces for this configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
        }
    }

    /// Rejects settings the wire format or the sockets cannot honour.
    pub fn validate(&self) -> Result<()> {
        // Frames carry a u32 length; leave room for the key and the header.
        const MAX_FIELD: usize = (u32::MAX as usize) / 2;
        if self.max_value_bytes > MAX_FIELD {
            return Err(Error::InvalidArgument(format!(
                "store max_value_bytes {} exceeds {MAX_FIELD}",
                self.max_value_bytes
            )));
        }
        if self.max_key_bytes == 0 || self.max_key_bytes > MAX_FIELD {
            return Err(Error::InvalidArgument(format!(
                "store max_key_bytes {} must be between 1 and {MAX_FIELD}",
                self.max_key_bytes
            )));
        }
        if self.max_connections == 0 || self.max_unauthenticated_per_ip == 0 {
            return Err(Error::InvalidArgument(format!(
                "store max_connections ({}) and max_unauthenticated_per_ip ({}) must be positive",
                self.max_connections, self.max_unauthenticated_per_ip
            )));
        }
        if self.auth_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "store auth_timeout must be positive".into(),
            ));
        }
        Ok(())
    }
}
