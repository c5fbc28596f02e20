//! The driver's pure parts: context words. The protocol itself is tested through libfabric's providers
//! (`crate::ofi`'s tests, and the collectives over `GW_TRANSPORT=ofi`).

use super::driver::{Ctx, REQ_MASK};

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
