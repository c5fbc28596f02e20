//! The exchange whose receives wait for their own sends (see
//! `test_drive::exchange_waiting_for_sends`), over TCP: messages past the
//! frame credits are announced and wait for a `Cts`, small ones spend
//! small credits, and frames nobody asked for yet arrive on the same
//! sockets as the clearances. TCP reads every frame into a buffer whatever
//! is posted, so no clearance can wait behind one; this holds it to that.

use super::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn exchanges_whose_receives_wait_for_their_sends_finish(
        lanes in 1usize..3,
        segment_bytes in prop::sample::select(vec![64usize, 1024, 8192]),
        eager_frames in 0usize..4,
        small_frames in 0usize..4,
        fracs in prop::collection::vec(0.0f64..12.0, 1..12),
        window in 1usize..4,
        ahead in 1usize..12,
        turns in prop::collection::vec(any::<bool>(), 1..24),
    ) {
        let (a, b) = pair_with(TcpConfig {
            lanes,
            segment_bytes,
            eager_frames,
            small_frames,
            ..TcpConfig::default()
        });
        let sizes: Vec<usize> = fracs.iter().map(|x| (x * segment_bytes as f64) as usize).collect();
        let r = crate::test_drive::exchange_waiting_for_sends(
            a, b, &sizes, (window, ahead), &turns, tag);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
