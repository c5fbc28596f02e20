//! The driver's pure parts: context words and how bounce buffers are dealt
//! to peers. The protocol itself is tested through libfabric's providers
//! (`crate::ofi`'s tests, and the collectives over `GW_TRANSPORT=ofi`).

use super::driver::{Ctx, REQ_MASK, bounce_count, bounce_owner};
use crate::seam::Rank;

#[test]
fn contexts_round_trip() {
    for c in [
        Ctx::Bounce(0),
        Ctx::Bounce(4095),
        Ctx::Stage(63),
        Ctx::Write { peer: 0, req: 1 },
        Ctx::Write {
            peer: (1 << 22) - 1,
            req: REQ_MASK,
        },
        Ctx::OneSided { peer: 3, req: 7 },
        Ctx::OneSided {
            peer: (1 << 22) - 1,
            req: REQ_MASK,
        },
    ] {
        assert_eq!(Ctx::decode(c.encode()), Some(c));
    }
}

/// Stacks with a receive queue per connection (verbs) need every peer to
/// own bounce buffers, never this rank, and in equal shares.
#[test]
fn bounce_buffers_are_dealt_to_every_other_rank_in_turn() {
    for world in [2usize, 3, 4, 7, 64, 1000] {
        let n = bounce_count(world, 8);
        for me in [0, world / 2, world - 1] {
            let me = me as Rank;
            let mut per = vec![0usize; world];
            for i in 0..n {
                let o = bounce_owner(me, world, i);
                assert_ne!(o, me, "world {world}: buffer {i} dealt to the rank itself");
                per[o as usize] += 1;
            }
            let others: Vec<usize> = (0..world)
                .filter(|&r| r != me as usize)
                .map(|r| per[r])
                .collect();
            let (lo, hi) = (others.iter().min().unwrap(), others.iter().max().unwrap());
            assert!(hi - lo <= 1, "world {world} rank {me}: shares {lo}..{hi}");
            if world <= 64 {
                assert!(
                    *lo >= 8 + 4,
                    "world {world}: a peer got {lo} buffers, fewer than its credits"
                );
            }
        }
    }
}
