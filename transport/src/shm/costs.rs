//! Which way a large message crosses is chosen by what copies cost now.
//!
//! A message can cross by one pull (the receiver's `process_vm_readv`,
//! which pins the sender's pages and copies them) or through the slots (the
//! sender copies in, the receiver copies out). Which is cheaper is not a
//! property of the code: on the development VM it flips with the host's
//! placement of its virtual processors, for minutes at a time. In one phase
//! the receiver's copy out of lines another core just wrote is slow and the
//! pull wins by 2x; in the other the pull's page pinning dominates and the
//! slots win by 2x (docs/performance.md, "Pull or slots, measured"). So the
//! sender of a segment that the size rules would have pulled compares the
//! two costs as measured on this very ring: the receiver publishes what
//! its pulls and its copies out of the slots cost per byte, the sender
//! keeps what its copies in cost, and every [`PROBE_EVERY`]th such message
//! takes the other way, so that neither figure goes stale.
//!
//! The comparison is of total processor time per byte: one pull against
//! the two slot copies added. In a collective both ranks copy at once and
//! that is what a step costs; a one-way stream, whose two slot copies run
//! on two processors, may gain more from the slots than this says, never
//! less.

use std::time::{Duration, Instant};

/// Copies from this size on are timed: a clock read is then well under
/// 1% of the copy.
pub(crate) const MEASURED_BYTES: usize = 64 << 10;

/// One message in this many of those the size rules would pull and whose
/// copy is timed crosses the way currently not chosen, to measure it again,
/// where the two ways cost about the same.
pub(crate) const PROBE_EVERY: u64 = 32;

/// Messages hinted `SendHint::Stored` are chosen by cost from this size
/// on (see `post_send`); shorter ones keep their pulls.
pub(crate) const STORED_CHOICE_BYTES: usize = 256 << 10;

/// Messages after a probe within which a fall of the way not chosen's
/// cost is taken as that probe's doing (see [`PathChoice::pull`]): its
/// copies are timed as it lands, a message or two later.
pub(crate) const FALL_WINDOW: u64 = 4;

/// The most [`PROBE_EVERY`] is stretched by where the way not chosen costs
/// many times more (see [`PathChoice::pull`]).
pub(crate) const PROBE_STRETCH_MAX: u64 = 16;

/// A clock started for a copy of `bytes` if such a copy is timed: every
/// site that times one starts it here, so that shorter copies, most of
/// them, never read the clock.
pub(crate) fn timer(bytes: usize) -> Option<Instant> {
    (bytes >= MEASURED_BYTES).then(Instant::now)
}

/// Picoseconds per byte of a copy of `bytes` that took `elapsed`, at least 1
/// (0 means "not measured" wherever these are kept).
pub(crate) fn ps_per_byte(elapsed: Duration, bytes: usize) -> u32 {
    let ps = elapsed.as_nanos().saturating_mul(1000) / bytes.max(1) as u128;
    ps.clamp(1, u32::MAX as u128) as u32
}

/// A running cost with `sample` mixed in: a quarter of the weight on the
/// newest, so a phase change shows within a few messages. A sample is
/// taken as at most 4x the running cost: one copy preempted or faulting
/// would otherwise count for hundreds of messages on the way not chosen,
/// which only the probes measure.
pub(crate) fn mix(old: u32, sample: u32) -> u32 {
    if old == 0 {
        return sample;
    }
    let sample = (sample as u64).min(4 * old as u64);
    ((3 * old as u64 + sample) / 4) as u32
}

/// The sender's choice for one peer.
#[derive(Debug, Default)]
pub(crate) struct PathChoice {
    /// Messages since the last probe that the size rules would pull, long
    /// enough for their copies to be timed.
    since_probe: u64,
    /// The way not chosen at the last probe (true: the slots) and its
    /// cost then (0: none).
    at_probe: (bool, u64),
}

/// What a choice is made from, in picoseconds per byte, 0 where not yet
/// measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Costs {
    /// The receiver's pulls out of our process.
    pub pull: u32,
    /// Our copies into the slots.
    pub slot_in: u32,
    /// The receiver's copies out of the slots.
    pub slot_out: u32,
}

impl PathChoice {
    /// Whether the next message that the size rules would pull is pulled;
    /// `len` is its longest copy (its length, or a slot's where shorter:
    /// the slots copy a frame at a time). Until both ways are measured,
    /// pulls stay the rule.
    ///
    /// Every [`PROBE_EVERY`]th message whose copies are timed takes the
    /// other way (another would measure nothing); where both are measured,
    /// every `PROBE_EVERY * r`th instead, `r` the way not chosen's cost
    /// over the chosen one's, rounded down, at most [`PROBE_STRETCH_MAX`].
    /// A probe costs about `r - 1` messages more, so the probes cost
    /// `(r - 1) / (PROBE_EVERY * r)` of the time, under 1/32, up to `r` =
    /// 16, and `(r - 1) / 512` beyond. At a fixed interval, a phase where
    /// the slots copied at a fifth of the pull's speed made every probe
    /// through them cost four messages more (the 4 MiB ping-pong's mean
    /// 3-8% slower). Spaced out, probes would follow a phase change in the
    /// other way's favour slowly, a quarter of the way per sample
    /// ([`mix`]); so where, within [`FALL_WINDOW`] messages of a probe,
    /// the way not chosen measures an eighth or more cheaper than when the
    /// probe was sent, the next message probes again, until it stops
    /// falling or is chosen. Only that window counts: other traffic moves
    /// these costs too (every timed copy into or out of the slots, every
    /// timed pull), and read from one message to the next its jitter would
    /// pass for falls and probe far more often than the spacing allows.
    pub(crate) fn pull(&mut self, c: Costs, len: usize) -> bool {
        let slots = c.slot_in as u64 + c.slot_out as u64;
        let both_known = c.pull != 0 && c.slot_in != 0 && c.slot_out != 0;
        let prefer_pull = !both_known || (c.pull as u64) <= slots;
        let (every, other) = if both_known {
            let (chosen, other) = if prefer_pull {
                (c.pull as u64, slots)
            } else {
                (slots, c.pull as u64)
            };
            let r = (other / chosen).clamp(1, PROBE_STRETCH_MAX);
            (PROBE_EVERY * r, other)
        } else {
            (PROBE_EVERY, 0)
        };
        let probe = len >= MEASURED_BYTES && {
            self.since_probe += 1;
            // Soon after a probe, the same way still not chosen, and an
            // eighth cheaper than when the probe went.
            let (was_slots, was) = self.at_probe;
            let falling = self.since_probe <= FALL_WINDOW
                && other != 0
                && was != 0
                && was_slots == prefer_pull
                && other < was - was / 8;
            self.since_probe >= every || falling
        };
        if probe {
            self.since_probe = 0;
            self.at_probe = (prefer_pull, other);
        }
        prefer_pull != probe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices(c: Costs, n: usize) -> Vec<bool> {
        let mut p = PathChoice::default();
        (0..n).map(|_| p.pull(c, MEASURED_BYTES)).collect()
    }

    fn costs(pull: u32, slot_in: u32, slot_out: u32) -> Costs {
        Costs {
            pull,
            slot_in,
            slot_out,
        }
    }

    fn pulled(v: &[bool]) -> usize {
        v.iter().filter(|&&b| b).count()
    }

    #[test]
    fn unmeasured_costs_keep_pulls_and_probe_the_slots() {
        let c = costs(0, 0, 0);
        let v = choices(c, 64);
        assert_eq!(pulled(&v), 62);
        assert!(!v[31] && !v[63], "the 32nd and 64th go through the slots");
        // A pull measured but the slots not: the same.
        let v = choices(Costs { pull: 100, ..c }, 64);
        assert_eq!(pulled(&v), 62);
        let v = choices(costs(100, 10, 0), 64);
        assert_eq!(pulled(&v), 62, "one slot copy measured is not enough");
    }

    #[test]
    fn the_cheaper_way_wins_and_the_other_is_probed() {
        // Pull 100 ps/B against 40 + 50: the slots.
        let c = costs(100, 40, 50);
        let v = choices(c, 64);
        assert_eq!(pulled(&v), 2);
        assert!(v[31] && v[63]);
        // Pull 80 against 90: the pull.
        let v = choices(Costs { pull: 80, ..c }, 64);
        assert_eq!(pulled(&v), 62);
        // A tie goes to the pull: one copy, and no slots held.
        let v = choices(Costs { pull: 90, ..c }, 32);
        assert_eq!(pulled(&v), 31);
    }

    #[test]
    fn a_way_that_costs_many_times_more_is_probed_less_often() {
        // Pulls at 74 ps/B against slots at 300 + 60: 4x, every 128th.
        let v = choices(costs(74, 300, 60), 512);
        assert_eq!(512 - pulled(&v), 4);
        assert!(!v[127] && !v[255] && v[31] && v[63]);
        // The other way round: slots 20 + 20 against pulls at 90, 2x.
        let v = choices(costs(90, 20, 20), 512);
        assert_eq!(pulled(&v), 8);
        assert!(v[63] && !v[31]);
        // However lopsided, at least one message in PROBE_EVERY *
        // PROBE_STRETCH_MAX measures the other way.
        let every = (PROBE_EVERY * PROBE_STRETCH_MAX) as usize;
        let v = choices(costs(1, 1000, 1000), 2 * every);
        assert_eq!(2 * every - pulled(&v), 2);
        assert!(!v[every - 1] && !v[2 * every - 1]);
    }

    #[test]
    fn a_probe_that_finds_the_other_way_cheaper_is_followed_at_once() {
        let mut p = PathChoice::default();
        // Slots measured at 560 + 100 against pulls at 74: every 256th.
        let cold = costs(74, 560, 100);
        let v: Vec<bool> = (0..256).map(|_| p.pull(cold, MEASURED_BYTES)).collect();
        assert_eq!(pulled(&v), 255);
        assert!(!v[255], "the 256th probes");
        // That probe's sample brought the slots down by more than an
        // eighth: the next message probes again, and so on while they fall.
        assert!(!p.pull(costs(74, 420, 80), MEASURED_BYTES));
        assert!(!p.pull(costs(74, 320, 60), MEASURED_BYTES));
        // Down by less than an eighth: back to the spacing (r = 4 now).
        let v: Vec<bool> = (0..64)
            .map(|_| p.pull(costs(74, 300, 58), MEASURED_BYTES))
            .collect();
        assert_eq!(pulled(&v), 64);
        // A fall long after the last probe is other traffic's: no probe.
        assert!(p.pull(costs(74, 200, 40), MEASURED_BYTES));
        // Cheaper than the pull at last: chosen, but for a probe of the
        // pull at once (66 messages since the last probe, where r = 1 now
        // asks for one in 32).
        let v: Vec<bool> = (0..32)
            .map(|_| p.pull(costs(74, 30, 30), MEASURED_BYTES))
            .collect();
        assert_eq!(pulled(&v), 1);
        assert!(v[0]);
    }

    #[test]
    fn a_flip_of_the_way_chosen_or_a_short_message_is_no_fall() {
        let mut p = PathChoice::default();
        let cold = costs(74, 560, 100);
        for _ in 0..256 {
            p.pull(cold, MEASURED_BYTES);
        }
        // Just after that probe the slots come out cheaper than the pull:
        // the way not chosen is the pull now, at 74 against the slots' 660
        // when the probe went, which is no fall of the pull's.
        assert!(!p.pull(costs(74, 30, 30), MEASURED_BYTES));
        assert!(!p.pull(costs(74, 30, 30), MEASURED_BYTES));
        // A message too short to be timed neither probes nor counts.
        let mut q = PathChoice::default();
        for _ in 0..256 {
            q.pull(cold, MEASURED_BYTES);
        }
        for _ in 0..10 {
            assert!(q.pull(costs(74, 300, 60), MEASURED_BYTES - 1));
        }
        // Still within the window of the probe: the fall is seen now.
        assert!(!q.pull(costs(74, 300, 60), MEASURED_BYTES));
    }

    #[test]
    fn messages_too_short_to_be_timed_are_never_probes() {
        let c = costs(100, 40, 50);
        let mut p = PathChoice::default();
        let short: Vec<bool> = (0..64).map(|_| p.pull(c, MEASURED_BYTES - 1)).collect();
        assert_eq!(pulled(&short), 0, "the cheaper way, every time");
        // Nor do they count towards the next probe.
        let long: Vec<bool> = (0..32).map(|_| p.pull(c, MEASURED_BYTES)).collect();
        assert_eq!(pulled(&long), 1);
        assert!(long[31]);
        let unknown = costs(0, 0, 0);
        assert!((0..64).all(|_| p.pull(unknown, 1000)));
    }

    #[test]
    fn costs_are_picoseconds_per_byte_never_zero() {
        assert_eq!(ps_per_byte(Duration::from_micros(10), 100_000), 100);
        assert_eq!(ps_per_byte(Duration::ZERO, 1 << 20), 1);
        assert_eq!(ps_per_byte(Duration::from_secs(10), 0), u32::MAX);
    }

    #[test]
    fn a_running_cost_starts_at_its_first_sample_and_follows_slowly() {
        assert_eq!(mix(0, 80), 80);
        assert_eq!(mix(80, 160), 100);
        // An outlier counts as 4x the running cost at most.
        assert_eq!(mix(100, 1_000_000), 175);
        let mut c = 100;
        for _ in 0..12 {
            c = mix(c, 300);
        }
        assert!((290..=300).contains(&c), "{c}");
        assert_eq!(mix(u32::MAX, u32::MAX), u32::MAX);
    }
}
