//! The 32-bit immediate that rides on every one-sided write.
//!
//! A write with immediate data lands its bytes in the peer's memory and hands
//! the peer one 32-bit number as a completion; that number is all the peer
//! learns about the write, so it has to say which transfer the bytes belong
//! to. Two kinds of transfer exist:
//!
//! - a **message** into a receive the peer granted: the grant's slot and the
//!   slot's generation (a slot is reused for message after message, and a
//!   write that names an old generation is a protocol violation, not bytes
//!   for the current one);
//! - a **window** chunk of a persistent operation: which of the rank's
//!   persistent windows, which round (mod 256), which chunk.
//!
//! Layout (bit 31 tells the kinds apart):
//! ```text
//! message: 0 | slot (11 bits) | generation (20 bits)
//! window:  1 | window (7 bits) | round (8 bits) | chunk (16 bits)
//! ```
//! 32 bits is what every provider carries (verbs' `imm_data`, libfabric's
//! `cq_data_size` is at least 4), so nothing wider is assumed.

use crate::error::{Error, Result};

/// Receive slots per peer an immediate can name.
pub const MAX_SLOTS: usize = 1 << 11;
/// Generations of a slot before the counter wraps.
pub const GEN_MODULUS: u32 = 1 << 20;
/// Persistent windows per rank an immediate can name.
pub const MAX_WINDOWS: usize = 1 << 7;
/// Chunks a persistent window can be written in per round.
pub const MAX_CHUNKS: usize = 1 << 16;

const WINDOW_BIT: u32 = 1 << 31;

/// What a received immediate says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Imm {
    /// A segment of the message granted in `slot`, use number `generation`.
    Message { slot: u16, generation: u32 },
    /// Chunk `chunk` of persistent window `window`, round `round` (mod 256).
    Window { window: u8, round: u8, chunk: u16 },
}

impl Imm {
    /// The 32-bit form. Fields past their width are a caller's bug, caught
    /// in debug builds; release builds keep the low bits.
    pub fn encode(self) -> u32 {
        match self {
            Imm::Message { slot, generation } => {
                debug_assert!((slot as usize) < MAX_SLOTS && generation < GEN_MODULUS);
                ((u32::from(slot) & 0x7ff) << 20) | (generation & (GEN_MODULUS - 1))
            }
            Imm::Window {
                window,
                round,
                chunk,
            } => {
                debug_assert!((window as usize) < MAX_WINDOWS);
                WINDOW_BIT
                    | ((u32::from(window) & 0x7f) << 24)
                    | (u32::from(round) << 16)
                    | u32::from(chunk)
            }
        }
    }

    /// Reads an immediate. Every 32-bit value is some immediate; whether it
    /// names a live transfer is for the receiver's tables to say.
    pub fn decode(v: u32) -> Imm {
        if v & WINDOW_BIT == 0 {
            Imm::Message {
                slot: ((v >> 20) & 0x7ff) as u16,
                generation: v & (GEN_MODULUS - 1),
            }
        } else {
            Imm::Window {
                window: ((v >> 24) & 0x7f) as u8,
                round: (v >> 16) as u8,
                chunk: v as u16,
            }
        }
    }

    /// Reads an immediate from a completion's data word, which providers
    /// report as 64 bits; a value past 32 bits is not one gradwire wrote.
    pub fn from_cq_data(peer: u32, data: u64) -> Result<Imm> {
        u32::try_from(data).map(Imm::decode).map_err(|_| {
            Error::Protocol(format!(
                "rank {peer} wrote with immediate data {data:#x}, wider than gradwire's 32 bits"
            ))
        })
    }
}

/// `v` with its round field set to `round` when it is a window immediate
/// (schedules are built once with round 0; each round stamps its number);
/// other immediates unchanged.
pub fn stamp_round(v: u32, round: u8) -> u32 {
    if v & WINDOW_BIT == 0 {
        return v;
    }
    (v & !(0xff << 16)) | (u32::from(round) << 16)
}

/// The segments a message of `len` bytes is written in, `seg` bytes each
/// (the last one shorter); an empty message is one empty write, so that its
/// receiver still gets a completion.
pub fn segments(len: usize, seg: usize) -> usize {
    debug_assert!(seg > 0);
    if len == 0 { 1 } else { len.div_ceil(seg) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn message_round_trips(slot in 0u16..(MAX_SLOTS as u16), generation in 0u32..GEN_MODULUS) {
            let i = Imm::Message { slot, generation };
            prop_assert_eq!(Imm::decode(i.encode()), i);
        }

        #[test]
        fn window_round_trips(window in 0u8..(MAX_WINDOWS as u8), round: u8, chunk: u16) {
            let i = Imm::Window { window, round, chunk };
            prop_assert_eq!(Imm::decode(i.encode()), i);
        }

        #[test]
        fn every_word_decodes_to_itself(v: u32) {
            prop_assert_eq!(Imm::decode(v).encode(), v);
        }

        #[test]
        fn segments_cover_the_message(len in 0usize..10_000_000, seg in 1usize..5_000_000) {
            let n = segments(len, seg);
            prop_assert!(n >= 1);
            prop_assert!(len <= n * seg);
            prop_assert!(len == 0 || (n - 1) * seg < len);
        }
    }

    proptest! {
        #[test]
        fn stamping_sets_only_a_window_round(v: u32, round: u8) {
            let s = stamp_round(v, round);
            match (Imm::decode(v), Imm::decode(s)) {
                (Imm::Window { window, chunk, .. }, got) => {
                    prop_assert_eq!(got, Imm::Window { window, round, chunk });
                }
                (m, got) => prop_assert_eq!(got, m),
            }
        }
    }

    #[test]
    fn wide_cq_data_is_refused_naming_the_peer() {
        let e = Imm::from_cq_data(3, 1 << 40).unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("0x10000000000"), "{e}");
        assert_eq!(
            Imm::from_cq_data(3, 5).unwrap(),
            Imm::Message {
                slot: 0,
                generation: 5
            }
        );
    }
}
