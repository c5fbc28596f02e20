//! A queue pair's address, as one rank publishes it for its peer.
//!
//! A reliable-connected queue pair can leave INIT only once it knows the
//! peer's queue pair number, starting packet sequence number, and how to
//! reach the peer's port (LID on InfiniBand, GID on RoCE) and its MTU. Each
//! rank publishes this [`QpEndpoint`] through gradwire's rendezvous store,
//! so the bytes come from another process, possibly another build: the
//! encoding is fixed-size with a magic, and the decoder checks every field
//! and never panics (property-tested).
//!
//! Layout, 32 bytes little endian: magic `GWQ1` 0..4, qpn 4..8 (24 bits),
//! psn 8..12 (24 bits), lid 12..14, MTU code 14 (`enum ibv_mtu`, 1..=5),
//! reserved 15 (zero), gid 16..32 (network order, as verbs hold it).

use crate::error::{Error, Result};
use crate::port::Mtu;

/// Bytes of an encoded endpoint.
pub const ENDPOINT_LEN: usize = 32;
const MAGIC: u32 = u32::from_le_bytes(*b"GWQ1");
/// Queue pair numbers and packet sequence numbers are 24-bit.
pub const MAX_24: u32 = (1 << 24) - 1;

/// What a peer needs to connect its queue pair to this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID chosen for the port (RoCE; the port GID on InfiniBand).
    pub gid: [u8; 16],
    /// The port's active MTU; the path uses the smaller of both sides'.
    pub mtu: Mtu,
}

impl QpEndpoint {
    pub fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12..14].copy_from_slice(&self.lid.to_le_bytes());
        b[14] = self.mtu.code() as u8;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Decodes an endpoint a peer published; anything malformed is an
    /// [`Error::BadEndpoint`] naming the field.
    pub fn decode(b: &[u8]) -> Result<QpEndpoint> {
        let bad = |what: String| Error::BadEndpoint(what);
        if b.len() != ENDPOINT_LEN {
            return Err(bad(format!("{} bytes, expected {ENDPOINT_LEN}", b.len())));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#010x}, expected {MAGIC:#010x} (not a gradwire verbs endpoint, or another version)"
            )));
        }
        let qpn = u32_at(4);
        if qpn > MAX_24 {
            return Err(bad(format!(
                "queue pair number {qpn:#x} is wider than 24 bits"
            )));
        }
        let psn = u32_at(8);
        if psn > MAX_24 {
            return Err(bad(format!(
                "packet sequence number {psn:#x} is wider than 24 bits"
            )));
        }
        let lid = u16::from_le_bytes([b[12], b[13]]);
        let mtu = Mtu::from_code(u32::from(b[14])).ok_or_else(|| {
            bad(format!(
                "MTU code {} is not one of 1 (256 B) to 5 (4096 B)",
                b[14]
            ))
        })?;
        if b[15] != 0 {
            return Err(bad("reserved byte is not zero".into()));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(QpEndpoint {
            qpn,
            psn,
            lid,
            gid,
            mtu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn endpoint() -> impl Strategy<Value = QpEndpoint> {
        (
            0..=MAX_24,
            0..=MAX_24,
            any::<u16>(),
            any::<[u8; 16]>(),
            1u32..=5,
        )
            .prop_map(|(qpn, psn, lid, gid, mtu)| QpEndpoint {
                qpn,
                psn,
                lid,
                gid,
                mtu: Mtu::from_code(mtu).unwrap(),
            })
    }

    proptest! {
        #[test]
        fn round_trips(ep in endpoint()) {
            prop_assert_eq!(QpEndpoint::decode(&ep.encode()).unwrap(), ep);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = QpEndpoint::decode(&b);
        }

        #[test]
        fn arbitrary_32_bytes_never_panic_and_reencode(b in any::<[u8; 32]>()) {
            if let Ok(ep) = QpEndpoint::decode(&b) {
                prop_assert_eq!(ep.encode(), b);
            }
        }

        #[test]
        fn a_flipped_magic_bit_is_refused(ep in endpoint(), i in 0usize..4, bit in 0u8..8) {
            let mut b = ep.encode();
            b[i] ^= 1 << bit;
            prop_assert!(QpEndpoint::decode(&b).is_err());
        }

        #[test]
        fn truncated_or_extended_is_refused(ep in endpoint(), n in 0usize..ENDPOINT_LEN) {
            let b = ep.encode();
            prop_assert!(QpEndpoint::decode(&b[..n]).is_err());
            let mut long = b.to_vec();
            long.push(0);
            prop_assert!(QpEndpoint::decode(&long).is_err());
        }
    }

    #[test]
    fn errors_name_the_field() {
        let ep = QpEndpoint {
            qpn: 0x1234,
            psn: 0xabcdef,
            lid: 7,
            gid: [0xfe; 16],
            mtu: Mtu::B4096,
        };
        let b = ep.encode();
        assert_eq!(&b[0..4], b"GWQ1");
        let msg = |b: &[u8]| QpEndpoint::decode(b).unwrap_err().to_string();
        assert_eq!(
            msg(&b[..31]),
            "bad queue-pair endpoint: 31 bytes, expected 32"
        );
        let mut x = b;
        x[7] = 1;
        assert!(msg(&x).contains("queue pair number"), "{}", msg(&x));
        let mut x = b;
        x[11] = 1;
        assert!(msg(&x).contains("packet sequence number"), "{}", msg(&x));
        let mut x = b;
        x[14] = 6;
        assert!(msg(&x).contains("MTU code 6"), "{}", msg(&x));
        let mut x = b;
        x[14] = 0;
        assert!(msg(&x).contains("MTU code 0"), "{}", msg(&x));
        let mut x = b;
        x[15] = 1;
        assert!(msg(&x).contains("reserved"), "{}", msg(&x));
        let mut x = b;
        x[0] = b'X';
        assert!(msg(&x).contains("magic"), "{}", msg(&x));
    }
}
