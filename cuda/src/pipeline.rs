//! The staging pipeline's core, with no I/O.
//!
//! Device data bound for another host goes through pinned host memory.
//! Copied whole, the copy to the host, the host operation and the copy
//! back run one after another; cut into segments, the copy of segment
//! k + 1 to the host and of segment k − 1 back to the device run on the
//! GPU's copy engines while the host works on segment k. This module
//! decides what may start when, from completions it is told of; the
//! driver (gw-capi) turns its actions into asynchronous copies, events and
//! host operations. It is deterministic, so its tests feed it completions
//! in every order the hardware could produce them.
//!
//! Rules: segments enter in order, each into a free slot (at most `slots`
//! hold data at once); host operations run in segment order, one at a
//! time (every rank runs the same sequence of collectives); a segment is
//! copied back once its operation ran, and its slot is free once that
//! copy finished. A rank whose input is not on the device (a broadcast's
//! receivers) skips the copy in; one whose output is not (a reduce's
//! non-roots) skips the copy back.

use std::ops::Range;

/// What the driver should start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Copy segment `seg` from the device into host slot `slot`.
    CopyIn { seg: usize, slot: usize },
    /// Run the host operation on segment `seg`, held in `slot`.
    Run { seg: usize, slot: usize },
    /// Copy segment `seg` back from `slot` to the device.
    CopyOut { seg: usize, slot: usize },
}

/// What the driver reports finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    CopiedIn(usize),
    Ran(usize),
    CopiedOut(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Waiting,
    CopyingIn,
    Ready,
    Running,
    Ran,
    CopyingOut,
    Finished,
}

/// One staged operation's pipeline.
#[derive(Debug)]
pub struct Pipeline {
    bytes: usize,
    seg_bytes: usize,
    copy_in: bool,
    copy_out: bool,
    stage: Vec<Stage>,
    slot: Vec<Option<usize>>,
    free: Vec<usize>,
    next_in: usize,
    /// The segment whose host operation is next (or running: it is only
    /// passed once `Ran` reports it, so one runs at a time).
    next_run: usize,
}

impl Pipeline {
    /// `bytes` in segments of `seg_bytes` (the last may be shorter), through
    /// `slots` host buffers. `copy_in`/`copy_out`: whether this rank's input
    /// and output are on the device.
    pub fn new(
        bytes: usize,
        seg_bytes: usize,
        slots: usize,
        copy_in: bool,
        copy_out: bool,
    ) -> Pipeline {
        let seg_bytes = seg_bytes.max(1);
        let segs = bytes.div_ceil(seg_bytes);
        let slots = slots.max(1);
        Pipeline {
            bytes,
            seg_bytes,
            copy_in,
            copy_out,
            stage: vec![Stage::Waiting; segs],
            slot: vec![None; segs],
            free: (0..slots).rev().collect(),
            next_in: 0,
            next_run: 0,
        }
    }

    /// Segments.
    pub fn segments(&self) -> usize {
        self.stage.len()
    }

    /// Byte range of segment `seg` within the buffer.
    pub fn range(&self, seg: usize) -> Range<usize> {
        let start = seg * self.seg_bytes;
        start..(start + self.seg_bytes).min(self.bytes)
    }

    /// Whether every segment is finished.
    pub fn is_done(&self) -> bool {
        self.stage.iter().all(|s| *s == Stage::Finished)
    }

    /// Everything that may start now; the driver starts them all, in order.
    pub fn poll(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        loop {
            let before = out.len();
            let mut freed = false;
            // Into free slots, in segment order.
            while self.next_in < self.segments() {
                let Some(slot) = self.free.pop() else { break };
                let seg = self.next_in;
                self.slot[seg] = Some(slot);
                self.next_in += 1;
                if self.copy_in {
                    self.stage[seg] = Stage::CopyingIn;
                    out.push(Action::CopyIn { seg, slot });
                } else {
                    self.stage[seg] = Stage::Ready;
                }
            }
            // The next host operation, once its input is there.
            if self.next_run < self.segments() && self.stage[self.next_run] == Stage::Ready {
                let seg = self.next_run;
                self.stage[seg] = Stage::Running;
                out.push(Action::Run {
                    seg,
                    slot: self.slot_of(seg),
                });
            }
            // Copies back (or, with no copy back, the slot is free at once).
            for seg in 0..self.next_run {
                if self.stage[seg] != Stage::Ran {
                    continue;
                }
                if self.copy_out {
                    self.stage[seg] = Stage::CopyingOut;
                    out.push(Action::CopyOut {
                        seg,
                        slot: self.slot_of(seg),
                    });
                } else {
                    self.finish(seg);
                    freed = true;
                }
            }
            if out.len() == before && !freed {
                return out;
            }
        }
    }

    /// Records a completion. A completion the pipeline did not ask for is
    /// an error naming it (a driver bug), never silently accepted.
    pub fn on(&mut self, done: Done) -> Result<(), String> {
        let (seg, want, next) = match done {
            Done::CopiedIn(s) => (s, Stage::CopyingIn, Stage::Ready),
            Done::Ran(s) => (s, Stage::Running, Stage::Ran),
            Done::CopiedOut(s) => (s, Stage::CopyingOut, Stage::Finished),
        };
        match self.stage.get(seg) {
            Some(s) if *s == want => {}
            Some(s) => return Err(format!("{done:?} while segment {seg} is {s:?}")),
            None => return Err(format!("{done:?}: there are {} segments", self.segments())),
        }
        if let Done::Ran(_) = done {
            self.next_run += 1;
        }
        if next == Stage::Finished {
            self.finish(seg);
        } else {
            self.stage[seg] = next;
        }
        Ok(())
    }

    fn finish(&mut self, seg: usize) {
        self.stage[seg] = Stage::Finished;
        if let Some(slot) = self.slot[seg].take() {
            self.free.push(slot);
        }
    }

    fn slot_of(&self, seg: usize) -> usize {
        self.slot[seg].unwrap_or(usize::MAX)
    }
}
