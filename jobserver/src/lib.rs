//! gradwire control plane: coordinating ranks, never carrying gradient bytes.
//!
//! The job server ([`server`], `gwjob serve`) keeps jobs, nodes and step plans in SQLite and
//! answers the step protocol; [`agent`] (`gwjob agent`) runs each node's
//! workers; [`cli`] is `gwjob submit|status|cancel`.

pub mod agent;
pub mod cli;
pub mod server;
