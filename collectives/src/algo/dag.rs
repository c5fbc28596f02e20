//! The machinery every algorithm shares: a schedule is a dependency graph of
//! actions, built once at construction and then released action by action.
//!
//! An algorithm emits its actions in program order into a [`Builder`]; the
//! builder derives the dependencies itself by tracking, per element range,
//! which action last wrote it and which actions read it since (read after
//! write, write after read, write after write). `Send` is tracked in the
//! address space of the `Recv` range it aliases in an in-place call, so the
//! write-after-read ordering that in-place calls need comes out of the same
//! bookkeeping, and a schedule that would read `Send` after writing its
//! aliased `Recv` element is caught at construction (debug builds).
//!
//! On top of that, messages to (and from) each peer are grouped into streams;
//! at most `depth` ([`OpSpec::depth`](super::OpSpec::depth)) messages of a stream are in flight at
//! once. Both sides of a stream list its messages in the same order
//! (increasing step), so the window cannot deadlock, whatever depth each side
//! uses.
//!
//! [`DagSchedule`] then hands out actions whose predecessors all completed:
//! `next_action` pops a queue and `complete` walks a precomputed successor
//! list, neither allocates.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use gw_transport::{Error, Rank, Result};

use super::{Action, ActionId, Buf, Loc, Remote, Schedule};

/// The deepest pipeline a schedule may ask for: scratch grows with the depth
/// (a slot per message in flight), past a few messages the transports' own
/// buffers already keep a link busy, and the transports reserve queue room
/// for this many messages per stream (two streams to a peer at most) so that
/// steady-state steps do not grow them.
pub const MAX_DEPTH: usize = 16;

/// Where an action sits in its algorithm, for [`Schedule::waiting_for`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Desc {
    /// Phase name, e.g. "reduce-scatter".
    pub phase: &'static str,
    /// Step within the phase (0-based) and the phase's number of steps.
    pub step: usize,
    pub nsteps: usize,
    /// Segment (0-based) and number of segments.
    pub seg: usize,
    pub nsegs: usize,
}

impl Desc {
    pub fn new(phase: &'static str, step: usize, nsteps: usize, seg: usize, nsegs: usize) -> Desc {
        Desc {
            phase,
            step,
            nsteps,
            seg,
            nsegs,
        }
    }
}

/// Chunk `c` of `count` elements cut into `n` nearly equal chunks (the first
/// `count % n` chunks are one element longer): `(offset, len)`.
pub(super) fn chunk(count: usize, n: usize, c: usize) -> (usize, usize) {
    let base = count / n;
    let rem = count % n;
    (c * base + c.min(rem), base + usize::from(c < rem))
}

/// Number of segments of at most `seg` elements in `len` elements.
pub(super) fn nsegs(len: usize, seg: usize) -> usize {
    len.div_ceil(seg)
}

/// Segment `k` of a range of `len` elements: `(offset within the range, len)`,
/// or `None` past its end.
pub(super) fn segment(len: usize, seg: usize, k: usize) -> Option<(usize, usize)> {
    if k >= nsegs(len, seg) {
        return None;
    }
    let off = k * seg;
    Some((off, seg.min(len - off)))
}

/// Fails when a schedule would need step numbers beyond `u32`.
pub(super) fn check_steps(what: &str, steps: Option<usize>) -> Result<()> {
    match steps {
        Some(s) if s <= u32::MAX as usize => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: too many segments for 32-bit step numbers; raise segment_elems"
        ))),
    }
}

/// A ring of scratch slots, each `slot_len` elements, handed out round-robin.
/// Reuse is safe by construction: the builder orders a slot's next writer
/// after its previous readers.
pub(super) struct Pool {
    base: usize,
    slot_len: usize,
    nslots: usize,
    next: usize,
}

impl Pool {
    /// The next slot, `len` (≤ the slot length) elements of it.
    pub fn slot(&mut self, len: usize) -> Loc {
        debug_assert!(len <= self.slot_len, "{len} > slot of {}", self.slot_len);
        let off = self.base + self.next * self.slot_len;
        self.next = (self.next + 1) % self.nslots;
        Loc::new(Buf::Scratch, off, len)
    }
}

/// Who last wrote an element range and who read it since.
#[derive(Clone)]
struct Interval {
    end: usize,
    writer: Option<u32>,
    readers: Vec<u32>,
}

/// Element ranges of one address space, disjoint, keyed by start.
#[derive(Default)]
struct Space {
    map: BTreeMap<usize, Interval>,
}

impl Space {
    /// Splits intervals so that `a` and `b` are boundaries and fills the gaps
    /// of `[a, b)` with fresh intervals.
    fn carve(&mut self, a: usize, b: usize) {
        for cut in [a, b] {
            let split = match self.map.range(..cut).next_back() {
                Some((&s, iv)) if iv.end > cut => Some(s),
                _ => None,
            };
            if let Some(s) = split {
                let iv = self.map.get_mut(&s).expect("interval");
                let tail = Interval {
                    end: iv.end,
                    writer: iv.writer,
                    readers: iv.readers.clone(),
                };
                iv.end = cut;
                self.map.insert(cut, tail);
            }
        }
        let mut gaps = Vec::new();
        let mut pos = a;
        for (&s, iv) in self.map.range(a..b) {
            if s > pos {
                gaps.push((pos, s));
            }
            pos = iv.end;
        }
        if pos < b {
            gaps.push((pos, b));
        }
        for (s, e) in gaps {
            self.map.insert(
                s,
                Interval {
                    end: e,
                    writer: None,
                    readers: Vec::new(),
                },
            );
        }
    }

    /// Records that `node` reads (or writes) `[a, b)`, adding the edges that
    /// order it after earlier conflicting accesses. Returns whether some other
    /// node wrote part of the range before.
    fn access(
        &mut self,
        a: usize,
        b: usize,
        node: u32,
        write: bool,
        edges: &mut Vec<(u32, u32)>,
    ) -> bool {
        if a >= b {
            return false;
        }
        // Fast path: schedules mostly touch whole segments they touched before.
        if let Some(iv) = self.map.get_mut(&a)
            && iv.end == b
        {
            return iv.touch(node, write, edges);
        }
        self.carve(a, b);
        let mut written = false;
        for (_, iv) in self.map.range_mut(a..b) {
            written |= iv.touch(node, write, edges);
        }
        written
    }
}

impl Interval {
    fn touch(&mut self, node: u32, write: bool, edges: &mut Vec<(u32, u32)>) -> bool {
        let written = matches!(self.writer, Some(w) if w != node);
        if let Some(w) = self.writer.filter(|_| written) {
            edges.push((w, node));
        }
        if write {
            edges.extend(
                self.readers
                    .iter()
                    .filter(|&&r| r != node)
                    .map(|&r| (r, node)),
            );
            self.readers.clear();
            self.writer = Some(node);
        } else if self.readers.last() != Some(&node) {
            self.readers.push(node);
        }
        written
    }
}

/// The in-place aliasing of a call: `Send[send_off + i]` is `Recv[recv_off + i]`
/// for `i < len`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Alias {
    pub send_off: usize,
    pub recv_off: usize,
    pub len: usize,
}

impl Alias {
    /// No element of Send is an element of Recv.
    pub const NONE: Alias = Alias {
        send_off: 0,
        recv_off: 0,
        len: 0,
    };
}

const SPACE_RECV: usize = 0;
const SPACE_SEND: usize = 1;
const SPACE_SCRATCH: usize = 2;
const SPACE_WINDOW: usize = 3;

/// Collects an algorithm's actions in program order (see the module comment).
pub(super) struct Builder {
    name: &'static str,
    actions: Vec<Action>,
    descs: Vec<Desc>,
    edges: Vec<(u32, u32)>,
    spaces: [Space; 4],
    /// Elements of [`Buf::Window`] used (see [`Builder::window`]).
    window: usize,
    landed: usize,
    alias: Alias,
    /// Every message: (peer, is_send, stream, node, step).
    messages: Vec<(Rank, bool, u32, u32, u32)>,
    scratch: usize,
    /// Messages in flight per stream.
    depth: usize,
}

impl Builder {
    /// `depth` is [`OpSpec::depth`](super::OpSpec::depth): messages in flight per stream.
    pub fn new(name: &'static str, alias: Alias, depth: usize) -> Builder {
        Builder {
            name,
            actions: Vec::new(),
            descs: Vec::new(),
            edges: Vec::new(),
            spaces: Default::default(),
            alias,
            messages: Vec::new(),
            scratch: 0,
            window: 0,
            landed: 0,
            depth: depth.max(1),
        }
    }

    /// Says that the schedule's window has `elems` elements.
    pub fn window(&mut self, elems: usize) {
        self.window = self.window.max(elems);
    }

    /// Reserves `nslots` scratch slots of `slot_len` elements.
    pub fn pool(&mut self, nslots: usize, slot_len: usize) -> Pool {
        let base = self.scratch;
        self.scratch += nslots * slot_len;
        Pool {
            base,
            slot_len,
            nslots: nslots.max(1),
            next: 0,
        }
    }

    fn push(&mut self, action: Action, desc: Desc) -> u32 {
        let id = self.actions.len() as u32;
        self.actions.push(action);
        self.descs.push(desc);
        id
    }

    /// Splits `loc` into address-space ranges: `(space, start, end)`.
    fn ranges(&self, loc: Loc) -> [(usize, usize, usize); 2] {
        let (a, b) = (loc.offset, loc.offset + loc.len);
        match loc.buf {
            Buf::Recv => [(SPACE_RECV, a, b), (SPACE_RECV, 0, 0)],
            Buf::Scratch => [(SPACE_SCRATCH, a, b), (SPACE_SCRATCH, 0, 0)],
            Buf::Window => [(SPACE_WINDOW, a, b), (SPACE_WINDOW, 0, 0)],
            Buf::Send => {
                // Schedules never read Send ranges straddling the alias
                // boundary in more than two pieces; the part outside the
                // aliased window keeps Send offsets in its own space.
                let al = self.alias;
                let (wa, wb) = (al.send_off, al.send_off + al.len);
                let (ia, ib) = (a.max(wa), b.min(wb));
                if ia < ib {
                    debug_assert!(a >= wa || b <= wb, "Send range straddles both alias edges");
                    let inside = (SPACE_RECV, ia - wa + al.recv_off, ib - wa + al.recv_off);
                    let outside = if a < wa {
                        (SPACE_SEND, a, wa)
                    } else {
                        (SPACE_SEND, wb, b.max(wb))
                    };
                    [inside, outside]
                } else {
                    [(SPACE_SEND, a, b), (SPACE_SEND, 0, 0)]
                }
            }
        }
    }

    fn read(&mut self, node: u32, loc: Loc) {
        for (space, a, b) in self.ranges(loc) {
            let written = self.spaces[space].access(a, b, node, false, &mut self.edges);
            debug_assert!(
                !(written && loc.buf == Buf::Send && space == SPACE_RECV),
                "{}: action {node} reads Send {loc:?} after the aliased Recv range was written",
                self.name
            );
        }
    }

    fn write(&mut self, node: u32, loc: Loc) {
        debug_assert!(loc.buf != Buf::Send, "writes to Send");
        for (space, a, b) in self.ranges(loc) {
            self.spaces[space].access(a, b, node, true, &mut self.edges);
        }
    }

    fn message(&mut self, node: u32, peer: Rank, is_send: bool, step: u32, stream: u32) {
        self.messages.push((peer, is_send, stream, node, step));
    }

    /// Sends `src` to `peer` as message `step` of `stream`.
    pub fn send(&mut self, peer: Rank, step: u32, stream: u32, src: Loc, desc: Desc) -> u32 {
        let id = self.push(
            Action::Send {
                id: self.actions.len(),
                peer,
                step,
                src,
            },
            desc,
        );
        self.read(id, src);
        self.message(id, peer, true, step, stream);
        id
    }

    /// Receives message `step` of `stream` from `peer` into `dst`.
    pub fn recv(&mut self, peer: Rank, step: u32, stream: u32, dst: Loc, desc: Desc) -> u32 {
        let id = self.push(
            Action::Recv {
                id: self.actions.len(),
                peer,
                step,
                dst,
            },
            desc,
        );
        self.write(id, dst);
        self.message(id, peer, false, step, stream);
        id
    }

    /// `dst = a ⊕ b`.
    pub fn reduce(&mut self, dst: Loc, a: Loc, b: Loc, finalize: bool, desc: Desc) -> u32 {
        debug_assert!(dst.len == a.len && dst.len == b.len);
        let id = self.push(
            Action::Reduce {
                id: self.actions.len(),
                dst,
                a,
                b,
                finalize,
            },
            desc,
        );
        self.read(id, a);
        self.read(id, b);
        self.write(id, dst);
        id
    }

    /// `dst = src`.
    pub fn copy(&mut self, dst: Loc, src: Loc, finalize: bool, desc: Desc) -> u32 {
        debug_assert!(dst.len == src.len);
        let id = self.push(
            Action::Copy {
                id: self.actions.len(),
                dst,
                src,
                finalize,
            },
            desc,
        );
        self.read(id, src);
        self.write(id, dst);
        id
    }

    /// Writes `src` one-sidedly into `peer`'s `dst`, announced by `imm`.
    /// The remote memory is not tracked here: the protocol (who may write
    /// where, when) is the algorithm's, made of messages and [`Builder::dep`].
    pub fn write_remote(&mut self, peer: Rank, src: Loc, dst: Remote, imm: u32, desc: Desc) -> u32 {
        let id = self.push(
            Action::Write {
                id: self.actions.len(),
                peer,
                src,
                dst,
                imm,
            },
            desc,
        );
        self.read(id, src);
        id
    }

    /// Reads `peer`'s published `src` into this rank's `dst`: to the graph
    /// a write of `dst` (the peer's memory is outside it; a schedule orders
    /// reads against the peer's changes with messages).
    pub fn read_remote(&mut self, peer: Rank, src: Remote, dst: Loc, desc: Desc) -> u32 {
        let id = self.push(
            Action::Read {
                id: self.actions.len(),
                peer,
                src,
                dst,
            },
            desc,
        );
        self.write(id, dst);
        id
    }

    /// Waits for `peer`'s write `imm` into this rank's `dst`: to the graph
    /// it is a write of `dst`, so what reads `dst` comes after it and it
    /// comes after what used `dst` before.
    pub fn landed(&mut self, peer: Rank, imm: u32, dst: Loc, desc: Desc) -> u32 {
        let id = self.push(
            Action::Landed {
                id: self.actions.len(),
                peer,
                imm,
                dst,
            },
            desc,
        );
        self.write(id, dst);
        self.landed += 1;
        id
    }

    /// Orders `to` after `from` (for dependencies that are not about memory).
    pub fn dep(&mut self, from: u32, to: u32) {
        debug_assert!(from < to);
        self.edges.push((from, to));
    }

    pub fn finish(mut self) -> DagSchedule {
        #[cfg(debug_assertions)]
        {
            let mut steps: Vec<_> = self
                .messages
                .iter()
                .map(|&(p, s, _, _, step)| (p, s, step))
                .collect();
            steps.sort_unstable();
            if let Some(w) = steps.windows(2).find(|w| w[0] == w[1]) {
                let (peer, is_send, step) = w[0];
                let dir = if is_send { "sends to" } else { "receives from" };
                panic!(
                    "{}: step {step} used twice for {dir} rank {peer}",
                    self.name
                );
            }
        }
        // Per stream in program order; each message waits for the one `depth`
        // before it in its stream.
        self.messages
            .sort_unstable_by_key(|&(p, s, st, node, _)| (p, s, st, node));
        // Both ends must list a stream in the same order: increasing steps.
        debug_assert!(
            self.messages
                .windows(2)
                .all(|w| (w[0].0, w[0].1, w[0].2) != (w[1].0, w[1].1, w[1].2) || w[0].4 < w[1].4),
            "{}: a stream's steps do not increase in program order",
            self.name
        );
        for w in self.messages.windows(self.depth + 1) {
            let (first, last) = (w[0], w[self.depth]);
            if (first.0, first.1, first.2) == (last.0, last.1, last.2) {
                self.edges.push((first.3, last.3));
            }
        }
        let n = self.actions.len();
        let mut edges = self.edges;
        edges.sort_unstable();
        edges.dedup();
        let mut succ_start = vec![0u32; n + 1];
        let mut pending = vec![0u32; n];
        for &(a, b) in &edges {
            debug_assert!(a < b, "edge {a} -> {b} against program order");
            succ_start[a as usize + 1] += 1;
            pending[b as usize] += 1;
        }
        for i in 0..n {
            succ_start[i + 1] += succ_start[i];
        }
        // Sorted by source, so the targets are already grouped by it.
        let succ: Vec<u32> = edges.iter().map(|&(_, b)| b).collect();
        let mut ready = VecDeque::with_capacity(n);
        ready.extend((0..n as u32).filter(|&i| pending[i as usize] == 0));
        DagSchedule {
            name: self.name,
            actions: self.actions,
            descs: self.descs,
            succ_start,
            succ,
            indegree: pending.clone(),
            pending,
            state: vec![State::Waiting; n],
            ready,
            finished: 0,
            scratch: self.scratch,
            window: self.window,
            landed: self.landed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    InFlight,
    Done,
}

/// A schedule whose actions were all laid out at construction.
pub(super) struct DagSchedule {
    name: &'static str,
    actions: Vec<Action>,
    descs: Vec<Desc>,
    succ_start: Vec<u32>,
    succ: Vec<u32>,
    /// Each action's number of predecessors, which `pending` counts down
    /// from; kept so that [`Schedule::reset`] can rewind without rebuilding.
    indegree: Vec<u32>,
    pending: Vec<u32>,
    state: Vec<State>,
    ready: VecDeque<u32>,
    finished: usize,
    scratch: usize,
    window: usize,
    landed: usize,
}

impl Schedule for DagSchedule {
    fn name(&self) -> &'static str {
        self.name
    }

    fn next_action(&mut self) -> Option<Action> {
        let i = self.ready.pop_front()? as usize;
        self.state[i] = State::InFlight;
        Some(self.actions[i])
    }

    fn complete(&mut self, id: ActionId) {
        let Some(state) = self.state.get_mut(id) else {
            debug_assert!(false, "{}: completion of unknown action {id}", self.name);
            return;
        };
        if *state != State::InFlight {
            debug_assert!(
                false,
                "{}: completion of action {id} which is {state:?}",
                self.name
            );
            return;
        }
        *state = State::Done;
        self.finished += 1;
        for &s in &self.succ[self.succ_start[id] as usize..self.succ_start[id + 1] as usize] {
            let p = &mut self.pending[s as usize];
            *p -= 1;
            if *p == 0 {
                self.ready.push_back(s);
            }
        }
    }

    fn is_done(&self) -> bool {
        self.finished == self.actions.len()
    }

    fn scratch_elems(&self) -> usize {
        self.scratch
    }

    fn window_elems(&self) -> usize {
        self.window
    }

    fn landed_actions(&self) -> usize {
        self.landed
    }

    fn reset(&mut self) -> bool {
        // Same state as `Builder::finish` leaves, in the vectors it sized:
        // `ready` had capacity for every action, so refilling it never grows it.
        self.pending.copy_from_slice(&self.indegree);
        self.state.fill(State::Waiting);
        self.ready.clear();
        let pending = &self.pending;
        self.ready
            .extend((0..pending.len() as u32).filter(|&i| pending[i as usize] == 0));
        self.finished = 0;
        true
    }

    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.actions.capacity() * size_of::<Action>()
            + self.descs.capacity() * size_of::<Desc>()
            + (self.succ_start.capacity()
                + self.succ.capacity()
                + self.indegree.capacity()
                + self.pending.capacity()
                + self.ready.capacity())
                * size_of::<u32>()
            + self.state.capacity() * size_of::<State>()
    }

    fn waiting_for(&self) -> String {
        let total = self.actions.len();
        if self.is_done() {
            return format!("{}: done ({total} actions)", self.name);
        }
        let in_flight = || (0..total).filter(|&i| self.state[i] == State::InFlight);
        let outstanding = in_flight().count();
        // The oldest outstanding receive says most; then sends; then local work.
        let pick = in_flight()
            .find(|&i| matches!(self.actions[i], Action::Recv { .. } | Action::Landed { .. }))
            .or_else(|| in_flight().find(|&i| matches!(self.actions[i], Action::Send { .. })))
            .or_else(|| in_flight().next());
        let mut s = String::new();
        match pick {
            Some(i) => {
                let d = self.descs[i];
                let _ = write!(
                    s,
                    "{} {} step {}/{}: ",
                    self.name,
                    d.phase,
                    d.step + 1,
                    d.nsteps
                );
                let _ = match self.actions[i] {
                    Action::Recv { peer, .. } => write!(s, "waiting for recv from rank {peer}"),
                    Action::Send { peer, .. } => {
                        write!(s, "waiting for send to rank {peer} to complete")
                    }
                    Action::Reduce { .. } => write!(s, "waiting for a local reduction"),
                    Action::Copy { .. } => write!(s, "waiting for a local copy"),
                    Action::Write { peer, .. } => {
                        write!(
                            s,
                            "waiting for a one-sided write to rank {peer} to complete"
                        )
                    }
                    Action::Read { peer, .. } => {
                        write!(
                            s,
                            "waiting for a one-sided read from rank {peer} to complete"
                        )
                    }
                    Action::Landed { peer, imm, .. } => write!(
                        s,
                        "waiting for rank {peer}'s one-sided write (immediate {imm:#010x}) to land"
                    ),
                };
                let _ = write!(s, " (segment {}/{})", d.seg + 1, d.nsegs);
                if outstanding > 1 {
                    let _ = write!(s, "; {} more actions outstanding", outstanding - 1);
                }
            }
            None => {
                let _ = write!(
                    s,
                    "{}: {} actions ready but not started",
                    self.name,
                    self.ready.len()
                );
            }
        }
        let _ = write!(s, "; {}/{total} actions finished", self.finished);
        s
    }
}
