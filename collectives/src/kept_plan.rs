//! The last collective's plan, kept for the next identical call.
//!
//! A training loop, and every benchmark, calls the same collective with the
//! same arguments over and over. Planning one (validation, the kernel, the
//! algorithm, the schedule's spec, the direct path's shape) is a pure
//! function of the call's arguments and of the communicator's fixed
//! settings, and at a few bytes it was a sixth of a call on the caller's
//! direct path: 2-rank shm reduce of 8 bytes, about 370 of the root's 2,250
//! instructions (callgrind). So each thread keeps the last plan it made on
//! each of the last few communicators it called, with the arguments it
//! came from, and a call whose arguments are the same takes it instead of
//! planning again. Per thread, so that taking it needs no lock. Only calls
//! that planned without an error are kept, so a bad call is refused every
//! time.
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
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Which communicator's plans a thread's kept plans are: a number no
/// other communicator of the process ever had (communicator ids can
/// repeat, after one with the same key was dropped).
pub(crate) struct KeptPlan {
    id: u64,
}

impl Default for KeptPlan {
    fn default() -> KeptPlan {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        KeptPlan {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// Plans kept per thread: a few, so that a thread alternating between
/// communicators still finds each one's.
const KEPT: usize = 4;

type Kept = [Option<(u64, PlanKey, Planned, Direct)>; KEPT];

thread_local! {
    // Per thread, not per communicator: the lock a shared slot needed (a
    // `try_lock` and its release, two locked instructions) cost a tenth of
    // an 8-byte collective on the host region.
    static LAST: RefCell<(Kept, usize)> = const { RefCell::new(([None; KEPT], 0)) };
}

impl KeptPlan {
    /// The plan this thread kept for `key` on this communicator, if any.
    pub(crate) fn get(&self, key: &PlanKey) -> Option<(Planned, Direct)> {
        LAST.with(|last| {
            let last = last.try_borrow().ok()?;
            last.0.iter().find_map(|e| match e {
                Some((id, k, planned, direct)) if *id == self.id && k == key => {
                    Some((*planned, *direct))
                }
                _ => None,
            })
        })
    }

    /// Keeps `planned` (and what the direct path would run of it) as this
    /// thread's plan of `key` on this communicator, in place of the one
    /// kept before for the communicator, else of the oldest.
    pub(crate) fn keep(&self, key: PlanKey, planned: Planned, direct: Direct) {
        LAST.with(|last| {
            let Ok(mut last) = last.try_borrow_mut() else {
                return;
            };
            let (kept, next) = &mut *last;
            let i = match kept.iter().position(|e| e.is_some_and(|e| e.0 == self.id)) {
                Some(i) => i,
                None => {
                    let i = *next;
                    *next = (i + 1) % KEPT;
                    i
                }
            };
            kept[i] = Some((self.id, key, planned, direct));
        });
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
