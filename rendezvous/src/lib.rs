//! gradwire's bring-up layer: how the ranks of a job find each other.
//!
//! Before any transport exists, a rank must learn who it is ([`launch_env`]:
//! the typed `GW_*` contract between launchers and ranks), where the job's
//! rendezvous store is ([`store`]: an authenticated key-value server and its
//! client), and what every other rank published there ([`peers`]: address,
//! host identity, pid). Nothing here moves gradient bytes or knows what a
//! collective is; transports and communicators are built from what this
//! layer hands them.

pub mod error;
pub mod launch_env;
pub mod nosignal;
pub mod peers;
pub mod ratelimit;
pub mod slurm;
pub mod store;
pub mod token;

pub use error::{Error, Result};
pub use launch_env::LaunchEnv;
pub use peers::PeerInfo;
pub use store::{StoreClient, StoreConfig, StoreServer};
