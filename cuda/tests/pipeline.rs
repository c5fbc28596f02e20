//! The staging pipeline's core under every order of completions the
//! hardware could produce: random orders, several sizes, slot counts and
//! copy directions, checking what each segment went through.

use gw_cuda::pipeline::{Action, Done, Pipeline};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Runs a pipeline to the end, completing in-flight work in random order,
/// and returns the actions in the order they were issued. Checks that no
/// slot is handed out while a segment holds it: a segment takes its slot
/// at its first action and gives it back at its last completion.
fn simulate(
    p: &mut Pipeline,
    slots: usize,
    copy_out: bool,
    rng: &mut rand::rngs::StdRng,
) -> Vec<Action> {
    let mut issued = Vec::new();
    let mut inflight: Vec<Done> = Vec::new();
    let mut held: HashMap<usize, usize> = HashMap::new(); // slot → segment
    for _ in 0..100_000 {
        for a in p.poll() {
            let (seg, slot, done) = match a {
                Action::CopyIn { seg, slot } => (seg, slot, Done::CopiedIn(seg)),
                Action::Run { seg, slot } => (seg, slot, Done::Ran(seg)),
                Action::CopyOut { seg, slot } => (seg, slot, Done::CopiedOut(seg)),
            };
            assert!(slot < slots, "{a:?}: only {slots} slots");
            let owner = *held.entry(slot).or_insert(seg);
            assert_eq!(owner, seg, "{a:?}: slot {slot} still holds segment {owner}");
            inflight.push(done);
            issued.push(a);
        }
        let running = inflight
            .iter()
            .filter(|d| matches!(d, Done::Ran(_)))
            .count();
        assert!(running <= 1, "{running} host operations at once");
        if p.is_done() {
            assert!(inflight.is_empty(), "done with {inflight:?} in flight");
            return issued;
        }
        assert!(
            !inflight.is_empty(),
            "stalled: nothing in flight and not done"
        );
        let d = inflight.swap_remove(rng.random_range(0..inflight.len()));
        p.on(d).expect("an expected completion");
        match d {
            Done::CopiedOut(seg) => held.retain(|_, s| *s != seg),
            Done::Ran(seg) if !copy_out => held.retain(|_, s| *s != seg),
            _ => {}
        }
    }
    panic!("the pipeline did not finish");
}

#[test]
fn every_segment_goes_in_runs_in_order_and_comes_back_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    for case in 0..400 {
        let bytes = match case % 4 {
            0 => 0,
            1 => rng.random_range(1..64),
            _ => rng.random_range(1..(1 << 20)),
        };
        let seg = rng.random_range(1..(1 << 18));
        let slots = rng.random_range(1..5);
        let (copy_in, copy_out) = [(true, true), (false, true), (true, false)][case % 3];
        let mut p = Pipeline::new(bytes, seg, slots, copy_in, copy_out);
        let n = p.segments();
        assert_eq!(n, bytes.div_ceil(seg));
        // The ranges tile the buffer.
        let mut next = 0;
        for k in 0..n {
            let r = p.range(k);
            assert_eq!(r.start, next);
            assert!(r.end > r.start && r.end - r.start <= seg);
            next = r.end;
        }
        assert_eq!(next, bytes);
        let issued = simulate(&mut p, slots, copy_out, &mut rng);
        let pos = |want: &dyn Fn(&Action) -> bool| issued.iter().position(want);
        let mut last_run = None;
        for k in 0..n {
            let cin = pos(&|a| matches!(a, Action::CopyIn { seg, .. } if *seg == k));
            let run = pos(&|a| matches!(a, Action::Run { seg, .. } if *seg == k));
            let cout = pos(&|a| matches!(a, Action::CopyOut { seg, .. } if *seg == k));
            let count = issued
                .iter()
                .filter(|a| matches!(a, Action::CopyIn { seg, .. } | Action::Run { seg, .. } | Action::CopyOut { seg, .. } if *seg == k))
                .count();
            assert_eq!(
                count,
                1 + usize::from(copy_in) + usize::from(copy_out),
                "segment {k}: {issued:?}"
            );
            let run = run.expect("ran");
            assert_eq!(cin.is_some(), copy_in);
            assert_eq!(cout.is_some(), copy_out);
            if let Some(c) = cin {
                assert!(c < run, "segment {k} ran before its copy in");
            }
            if let Some(c) = cout {
                assert!(run < c, "segment {k} copied back before it ran");
            }
            assert!(
                last_run.is_none_or(|l| l < run),
                "runs out of segment order"
            );
            last_run = Some(run);
        }
    }
}

#[test]
fn copies_overlap_the_host_work_when_there_are_slots() {
    // Two slots: segment 1's copy in is issued before segment 0 has run.
    let mut p = Pipeline::new(4 << 20, 1 << 20, 2, true, true);
    let first = p.poll();
    assert_eq!(
        first,
        vec![
            Action::CopyIn { seg: 0, slot: 0 },
            Action::CopyIn { seg: 1, slot: 1 }
        ]
    );
    p.on(Done::CopiedIn(0)).unwrap();
    assert_eq!(p.poll(), vec![Action::Run { seg: 0, slot: 0 }]);
    p.on(Done::Ran(0)).unwrap();
    p.on(Done::CopiedIn(1)).unwrap();
    // Segment 1 runs while segment 0 is copied back.
    assert_eq!(
        p.poll(),
        vec![
            Action::Run { seg: 1, slot: 1 },
            Action::CopyOut { seg: 0, slot: 0 }
        ]
    );
    // Segment 2 waits for segment 0's slot.
    p.on(Done::CopiedOut(0)).unwrap();
    assert_eq!(p.poll(), vec![Action::CopyIn { seg: 2, slot: 0 }]);
}

#[test]
fn an_unasked_completion_is_an_error_naming_it() {
    let mut p = Pipeline::new(3 << 20, 1 << 20, 2, true, true);
    let e = p.on(Done::Ran(0)).unwrap_err();
    assert!(e.contains("Ran(0)") && e.contains("Waiting"), "{e}");
    let _ = p.poll();
    assert!(p.on(Done::CopiedOut(0)).is_err());
    let e = p.on(Done::CopiedIn(7)).unwrap_err();
    assert!(e.contains("3 segments"), "{e}");
    p.on(Done::CopiedIn(0)).unwrap();
    assert!(p.on(Done::CopiedIn(0)).is_err(), "a second completion");
}
