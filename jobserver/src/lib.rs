//! gradwire control plane: coordinating ranks, never carrying gradient bytes.
//!
//! For now this is the launcher [`launcher`] (`gwrun`); the job server, step
//! planner and cluster scheduler will live beside it.

pub mod launcher;
