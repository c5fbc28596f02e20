//! What the gradwire job server and its clients say to each other.
//!
//! [`types`] holds the HTTP/JSON messages; the worker's step client (used by
//! Rust workers, the C ABI and through it Python) lives beside them so every
//! language speaks the protocol through one implementation. The client and
//! its HTTP stack are the feature `client` (on by default).

#[cfg(feature = "client")]
pub mod http;
#[cfg(feature = "client")]
pub mod step;
pub mod types;
