//! What the tests of every [`super::Nic`] share: two transports in one
//! process, driven by hand, and the message test each stack must pass.

use super::{Nic, NicConfig, NicTransport};
use crate::seam::{Outstanding, Tag, Transport};
use crate::test_tags;
use std::time::Duration;

/// Small sizes, so that a few messages use up credits, slots and windows:
/// eager up to 4096 bytes, 2 credits, 4 slots, 64 KiB segments, 4 writes
/// in flight.
pub(crate) fn small_config() -> NicConfig {
    NicConfig {
        eager_bytes: 4096,
        eager_frames: 2,
        slots: 4,
        segment_bytes: 64 << 10,
        window: 4,
        ..NicConfig::default()
    }
}

pub(crate) fn tag(seq: u64, step: u32) -> Tag {
    test_tags::tag(0x0f1, seq, 100, 0, step)
}

pub(crate) use crate::test_drive::reg;

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Progresses both until every request completes (at most 20 s).
pub(crate) fn run<N: Nic>(
    a: &mut NicTransport<N>,
    b: &mut NicTransport<N>,
    ra: Vec<Outstanding>,
    rb: Vec<Outstanding>,
) {
    crate::test_drive::run_both(a, b, ra, rb, Duration::from_secs(20));
}

/// Ranks 0 (`a`) and 1 (`b`), connected, exchange messages both ways at
/// once: eager ones (up to 4096 bytes in the tests' settings), just past
/// that, several segments and many, every byte checked.
pub(crate) fn messages_of_every_size_both_ways<N: Nic>(
    a: &mut NicTransport<N>,
    b: &mut NicTransport<N>,
    what: &str,
) {
    // Eager (<= 4096), just past it, several segments, many segments.
    for (k, len) in [0usize, 1, 100, 4096, 4097, 200_000, (3 << 20) + 5]
        .into_iter()
        .enumerate()
    {
        let mut sa = pattern(len, k as u8);
        let mut sb = pattern(len, 100 + k as u8);
        let mut da = vec![0u8; len];
        let mut db = vec![0u8; len];
        let (msa, mda) = (reg(a, &mut sa), reg(a, &mut da));
        let (msb, mdb) = (reg(b, &mut sb), reg(b, &mut db));
        let t = tag(k as u64, 0);
        let ra = vec![
            Outstanding::new(a.isend(1, t, msa, 0, len).unwrap()),
            Outstanding::new(a.irecv(1, t, mda, 0, len).unwrap()),
        ];
        let rb = vec![
            Outstanding::new(b.irecv(0, t, mdb, 0, len).unwrap()),
            Outstanding::new(b.isend(0, t, msb, 0, len).unwrap()),
        ];
        run(a, b, ra, rb);
        assert!(db == sa, "{what}: {len} bytes 0 -> 1 landed wrong");
        assert!(da == sb, "{what}: {len} bytes 1 -> 0 landed wrong");
        for m in [msa, mda] {
            a.deregister(m).unwrap();
        }
        for m in [msb, mdb] {
            b.deregister(m).unwrap();
        }
    }
}
