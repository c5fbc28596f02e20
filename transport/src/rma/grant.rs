//! The grant: a receiver's answer to an announced message, saying where in
//! its memory the sender may write it.
//!
//! This is the one control message of the one-sided path that carries more
//! than a header: the receive's registered address and key, its length, and
//! the slot whose immediate the sender's writes must carry. It travels on
//! whatever control channel the backend has (a send into the peer's bounce
//! buffers, or a write into its mailbox), so it has a fixed size and a
//! decoder that checks every field it can.
//!
//! Layout, 48 bytes little endian: magic 0..4, slot 4..6, reserved 6..8
//! (zero), generation 8..12, reserved 12..16 (zero), announcement id 16..24,
//! address 24..32, key 32..40, length 40..48.

use super::imm::{GEN_MODULUS, MAX_SLOTS};
use crate::error::{Error, Result};
use crate::wire::{le_u32, le_u64};

/// Bytes of an encoded grant.
pub const GRANT_LEN: usize = 48;
const MAGIC: u32 = u32::from_le_bytes(*b"GWG1");

/// Where the announced message `id` goes in the receiver's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The announcement this answers (the id the sender put in its `Rts`).
    pub id: u64,
    /// The receiver's slot; the sender's writes carry it in their immediate.
    pub slot: u16,
    pub generation: u32,
    /// Address to write at, as the backend's peer expects it (a virtual
    /// address, or an offset for providers that address by offset).
    pub addr: u64,
    /// Remote key of the registration covering the receive.
    pub key: u64,
    /// Bytes the receive expects.
    pub len: u64,
}

impl Grant {
    pub fn encode(&self) -> [u8; GRANT_LEN] {
        let mut b = [0u8; GRANT_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.slot.to_le_bytes());
        b[8..12].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[32..40].copy_from_slice(&self.key.to_le_bytes());
        b[40..48].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a grant rank `peer` sent; anything malformed is an
    /// [`Error::Protocol`] that says which field is wrong.
    pub fn decode(peer: u32, b: &[u8]) -> Result<Grant> {
        let bad = |what: String| Error::Protocol(format!("rank {peer} sent a bad grant: {what}"));
        if b.len() != GRANT_LEN {
            return Err(bad(format!("{} bytes, expected {GRANT_LEN}", b.len())));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| le_u32(b, i);
        let u64_at = |i: usize| le_u64(b, i);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#010x}, expected {MAGIC:#010x} (not a grant, or the control channel lost sync)"
            )));
        }
        if u16_at(6) != 0 || u32_at(12) != 0 {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let slot = u16_at(4);
        if slot as usize >= MAX_SLOTS {
            return Err(bad(format!(
                "slot {slot} past the {MAX_SLOTS} an immediate can name"
            )));
        }
        let generation = u32_at(8);
        if generation >= GEN_MODULUS {
            return Err(bad(format!(
                "generation {generation} past the {GEN_MODULUS} an immediate can name"
            )));
        }
        let g = Grant {
            id: u64_at(16),
            slot,
            generation,
            addr: u64_at(24),
            key: u64_at(32),
            len: u64_at(40),
        };
        if g.addr.checked_add(g.len).is_none() {
            return Err(bad(format!(
                "{} bytes at {:#x} run past the end of the address space",
                g.len, g.addr
            )));
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grant() -> impl Strategy<Value = Grant> {
        (
            any::<u64>(),
            0u16..(MAX_SLOTS as u16),
            0u32..GEN_MODULUS,
            0u64..(1 << 62),
            any::<u64>(),
            0u64..(1 << 62),
        )
            .prop_map(|(id, slot, generation, addr, key, len)| Grant {
                id,
                slot,
                generation,
                addr,
                key,
                len,
            })
    }

    proptest! {
        #[test]
        fn round_trips(g in grant()) {
            prop_assert_eq!(Grant::decode(1, &g.encode()).unwrap(), g);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = Grant::decode(1, &b);
        }

        #[test]
        fn a_flipped_header_byte_is_refused(g in grant(), i in 0usize..4, bit in 0u8..8) {
            let mut b = g.encode();
            b[i] ^= 1 << bit;
            prop_assert!(Grant::decode(1, &b).is_err());
        }
    }

    #[test]
    fn errors_name_the_field_and_the_peer() {
        let g = Grant {
            id: 1,
            slot: 2,
            generation: 3,
            addr: 4,
            key: 5,
            len: 6,
        };
        let short = Grant::decode(7, &g.encode()[..40]).unwrap_err().to_string();
        assert!(
            short.contains("rank 7") && short.contains("40 bytes"),
            "{short}"
        );
        let mut b = g.encode();
        b[4..6].copy_from_slice(&(MAX_SLOTS as u16).to_le_bytes());
        let slot = Grant::decode(7, &b).unwrap_err().to_string();
        assert!(slot.contains("slot 2048"), "{slot}");
        let mut b = g.encode();
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let wrap = Grant::decode(7, &b).unwrap_err().to_string();
        assert!(wrap.contains("address space"), "{wrap}");
        let mut b = g.encode();
        b[13] = 1;
        let reserved = Grant::decode(7, &b).unwrap_err().to_string();
        assert!(reserved.contains("reserved"), "{reserved}");
    }
}
