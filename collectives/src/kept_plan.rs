//! The last collective's plan, kept for the next identical call.
//!
//! A training loop, and every benchmark, calls the same collective with the
//! same arguments over and over. Planning one (validation, the kernel, the
//! algorithm, the schedule's spec, the direct path's shape) is a pure
//! function of the call's arguments and of the communicator's fixed
//! settings, and at a few bytes it was a sixth of a call on the caller's
//! direct path: 2-rank shm reduce of 8 bytes, about 370 of the root's 2,250
//! instructions (callgrind). So the communicator keeps the last plan with
//! the arguments it came from, and a call whose arguments are the same
//! takes it instead of planning again. Only calls that planned without an
//! error are kept, so a bad call is refused every time.
//!
//! The buffers' addresses are not part of a plan, only whether each is null
//! (a null buffer with bytes to move is refused): a loop that alternates
//! buffers still finds its plan.
//!
//! One thing a kept plan skips besides work: the info line that the
//! automatic algorithm choice prints when it changes (`auto_algo`). A call
//! that takes a kept plan makes no choice, so after sizes A, B (a
//! persistent init, which plans apart) and A again, the line for A's
//! algorithm is not printed a second time.

use crate::algo::Algo;
use crate::communicator::{Planned, RawOp};
use crate::engine::DirectShape;
use crate::op::OpKind;
use gw_transport::Rank;
use std::sync::Mutex;

/// What the direct path would run for a planned call made blocking: its
/// shape and its rounds (see `DirectOp`), `None` where it goes to the
/// engine.
pub(crate) type Direct = Option<(DirectShape, u32)>;

/// The arguments a plan is a function of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlanKey {
    kind: OpKind,
    dtype: crate::op::DType,
    redop: crate::op::RedOp,
    count: usize,
    root: Rank,
    /// The weight's bits (`f64` has no `Eq`; a weight is either the same
    /// number or another plan).
    weight: Option<u64>,
    algo: Option<Algo>,
    send_null: bool,
    recv_null: bool,
}

impl PlanKey {
    pub(crate) fn of(op: &RawOp, algo: Option<Algo>) -> PlanKey {
        // Destructured whole, so that a field added to `RawOp` is a compile
        // error here until someone decides whether plans depend on it.
        let RawOp {
            kind,
            dtype,
            redop,
            count,
            root,
            send,
            recv,
            weight,
        } = *op;
        PlanKey {
            kind,
            dtype,
            redop,
            count,
            root,
            weight: weight.map(f64::to_bits),
            algo,
            send_null: send.is_null(),
            recv_null: recv.is_null(),
        }
    }
}

/// The kept plan, behind a lock that is only ever tried: a caller that
/// finds it taken by another thread plans for itself.
#[derive(Default)]
pub(crate) struct KeptPlan {
    last: Mutex<Option<(PlanKey, Planned, Direct)>>,
}

impl KeptPlan {
    /// The plan kept for `key`, if the last plan kept was made for it.
    pub(crate) fn get(&self, key: &PlanKey) -> Option<(Planned, Direct)> {
        let last = self.last.try_lock().ok()?;
        match &*last {
            Some((k, planned, direct)) if k == key => Some((*planned, *direct)),
            _ => None,
        }
    }

    /// Keeps `planned` (and what the direct path would run of it) as the
    /// plan of `key`, in place of the one kept before.
    pub(crate) fn keep(&self, key: PlanKey, planned: Planned, direct: Direct) {
        if let Ok(mut last) = self.last.try_lock() {
            *last = Some((key, planned, direct));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{DType, RedOp};

    fn op(send: usize, recv: usize) -> RawOp {
        RawOp {
            kind: OpKind::AllReduce,
            dtype: DType::F32,
            redop: RedOp::Sum,
            count: 4,
            root: 0,
            send: send as *const u8,
            recv: recv as *mut u8,
            weight: None,
        }
    }

    #[test]
    fn every_argument_but_the_buffers_addresses_is_in_the_key() {
        let base = op(64, 128);
        let key = PlanKey::of(&base, None);
        assert_eq!(key, PlanKey::of(&op(4096, 8192), None), "addresses");
        let changed = [
            RawOp {
                kind: OpKind::Broadcast,
                ..base
            },
            RawOp {
                dtype: DType::F64,
                ..base
            },
            RawOp {
                redop: RedOp::Max,
                ..base
            },
            RawOp { count: 5, ..base },
            RawOp { root: 1, ..base },
            RawOp {
                weight: Some(0.5),
                ..base
            },
            op(0, 128),
            op(64, 0),
        ];
        for (i, o) in changed.iter().enumerate() {
            assert_ne!(key, PlanKey::of(o, None), "change {i}");
        }
        assert_ne!(key, PlanKey::of(&base, Some(Algo::Ring)), "algorithm");
        let w = |x: f64| {
            PlanKey::of(
                &RawOp {
                    weight: Some(x),
                    ..base
                },
                None,
            )
        };
        assert_ne!(w(0.5), w(0.25), "weights");
        assert_eq!(w(0.5), w(0.5));
    }
}
