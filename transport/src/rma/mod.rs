//! The one-sided (RMA) protocol, without I/O: what an RDMA backend (libfabric,
//! verbs) or a shared-memory one that can store into a peer's memory says and
//! counts, so that every such backend moves bytes by the same rules and the
//! rules are tested once, with simulated links that reorder and delay.
//!
//! Two-sided calls (`isend`/`irecv`) map onto one-sided writes the way
//! aws-ofi-nccl's RDMA protocol does, with the announcement on the sender's
//! side that gradwire's other backends already use (so that the receive
//! core's matching and its mismatch errors apply unchanged):
//!
//! 1. Small messages go eagerly as two-sided sends into the receiver's
//!    bounce buffers, bounded by the receive core's credits.
//! 2. A larger message is announced (`Rts`, [`Sender::announce`]).
//! 3. Once the receive is posted and a slot is free, the receiver answers
//!    with a [`Grant`]: the receive's address, key and slot
//!    ([`Receiver::clear_to_send`]).
//! 4. The sender writes the message in segments ([`Sender::next_write`]),
//!    each carrying the slot in its 32-bit immediate ([`Imm`]); its send is
//!    complete when the writes complete locally.
//! 5. The receiver counts landed writes per slot ([`Receiver::landed`]);
//!    the receive is complete when all have landed.
//!
//! Persistent operations skip steps 2 and 3: their windows are registered
//! and published once, and each round is a `Ready` per peer ([`window`]).

mod grant;
mod imm;
mod receiver;
mod sender;
pub mod window;

pub use grant::{GRANT_LEN, Grant};
pub use imm::{GEN_MODULUS, Imm, MAX_CHUNKS, MAX_SLOTS, MAX_WINDOWS, segments, stamp_round};
pub use receiver::{Receiver, ToGrant};
pub use sender::{Sender, Write};

#[cfg(test)]
mod tests;
