//! gradwire's collectives layer: combining bytes.
//!
//! A [`Communicator`] is brought up from the environment `gwrun` (or Slurm, or
//! torchrun) sets, and runs collectives on a progress engine thread. Each
//! collective algorithm is a deterministic state machine without I/O
//! ([`algo`]); the engine feeds it transfer completions and carries out the
//! sends, receives and reductions it asks for over whichever transport reaches
//! each peer.

pub mod algo;
pub mod reduce;

pub use gw_transport::{DType, Error, RedOp, Result};
