//! The progress engine: the transports and the operations' schedules of one
//! communicator.
//!
//! Callers submit operations through a channel; the engine runs them one at
//! a time in submission order (the order every rank agrees on), carrying out
//! each [`Action`] of the schedule over the transport that reaches the peer.
//! Point-to-point messages are the exception: they are not part of that
//! order (two ranks may post their sends and receives in any order, as MPI
//! allows), so each one runs as soon as it is submitted, beside the ordered
//! operation and the other messages. Their tags (a per-pair, per-direction
//! message number) keep them apart from each other and from collectives.
//! Memory keeps its order, though: an operation never starts while an
//! earlier one that touches the same bytes, one of them writing, has not
//! ended (`OpDesc::conflicts`), so `isend(t)` after a non-blocking
//! all-reduce of `t` sends the reduced `t`, as it would on one CUDA stream.
//! Who turns the engine is `drive.rs`'s business: its own thread, so that a
//! non-blocking collective advances while the caller computes, or a caller
//! blocked on its operation, which saves the hand-offs between threads.
//! [`Engine::turn`] is one round of work, the same whoever does it.
//!
//! Waiting is spin-then-sleep: after `spin_us` without progress the engine's
//! thread asks every transport to arm its wakeups and blocks in one
//! `mio::Poll`, so an idle communicator costs no CPU, and more ranks than
//! cores still make progress.
//!
//! Any transport error is fatal to the communicator: the engine tells every
//! connected peer (an abort frame), fails the running and queued operations,
//! and fails every later one with the original cause.

mod direct;
mod in_place;
mod prepared;
mod user_regs;

#[doc(hidden)]
pub use direct::direct_calls;
pub(crate) use direct::{DirectMessage, DirectOp, DirectShape, Left, Part};
#[doc(hidden)]
pub use in_place::in_place_reads;

use crate::algo::p2p::P2p;
use crate::algo::{Action, ActionId, Buf, Loc, Schedule};
use crate::board::Board;
use crate::host_coll::HostColl;
use crate::mailbox::Receiver;
use crate::op::{Fingerprint, OpKind};
pub(crate) use crate::operation::{Completion, Msg, OpDesc, Plan, Ptr, Published};
use crate::sched_cache::{self, ScheduleCache};
use crate::trace;
use gw_transport::rma::{Imm, stamp_round};
use gw_transport::seam::Readiness;
use gw_transport::seam::{ReadFrom, WriteImm};
use gw_transport::{Arrival, Error, Landed, MemHandle, Rank, Request, Result, SendHint, Transport};
use mio::{Events, Poll, Token, Waker};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};
use user_regs::OpMem;

/// The waker's token; transports use `index << 32 ..`.
pub(crate) const WAKER: Token = Token(usize::MAX);
/// How long an operation waits without progress before the engine checks
/// on the peers and the board, and how often it checks again after that.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(200);
/// How often an otherwise idle engine looks at the host region's queued
/// calls (`Engine::pump_host`).
const HOST_PUMP_EVERY: Duration = Duration::from_micros(50);
/// How long an operation may wait before the board is consulted.
const STALL: Duration = Duration::from_secs(1);

/// How long a closing engine keeps writing what callers sent at once and
/// returned from (`Transport::unsent`) before it drops its connections.
const CLOSE_FLUSH: Duration = Duration::from_secs(5);

/// How many times any engine of this process checked on a stalled operation
/// (see [`stall_checks`]).
static STALL_CHECKS: AtomicU64 = AtomicU64::new(0);

/// How many memory registrations any engine of this process made (see
/// [`registrations`]).
static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);

/// Buffers registered with a transport so far, process-wide: the
/// persistent tests use it to show that rounds register nothing.
#[doc(hidden)]
pub fn registrations() -> u64 {
    REGISTRATIONS.load(Ordering::Relaxed)
}

/// Two-sided messages (sends) and one-sided writes any engine of this
/// process posted (see [`messages_posted`]).
static SENDS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// (two-sided sends, one-sided writes) posted so far, process-wide: the
/// persistent tests count a round's control messages with it.
#[doc(hidden)]
pub fn messages_posted() -> (u64, u64) {
    (
        SENDS.load(Ordering::Relaxed),
        WRITES.load(Ordering::Relaxed),
    )
}

/// Stall checks so far, process-wide. They consult the store and so
/// allocate; the no-allocation test uses this to tell a stall (an overloaded
/// machine) from a steady-state step that allocates.
#[doc(hidden)]
pub fn stall_checks() -> u64 {
    STALL_CHECKS.load(Ordering::Relaxed)
}

/// A running operation's schedule: boxed (collectives, persistent rounds,
/// which go back to a cache), or a point-to-point message's, held by value
/// so that a message allocates nothing.
enum RunSched {
    Boxed(Box<dyn Schedule>),
    Message(P2p),
}

impl RunSched {
    /// The box, to give back to the cache or the persistent operation; a
    /// message's schedule is only dropped.
    fn into_boxed(self) -> Option<Box<dyn Schedule>> {
        match self {
            RunSched::Boxed(b) => Some(b),
            RunSched::Message(_) => None,
        }
    }
}

impl std::ops::Deref for RunSched {
    type Target = dyn Schedule;
    fn deref(&self) -> &(dyn Schedule + 'static) {
        match self {
            RunSched::Boxed(b) => b.as_ref(),
            RunSched::Message(p) => p,
        }
    }
}

impl std::ops::DerefMut for RunSched {
    fn deref_mut(&mut self) -> &mut (dyn Schedule + 'static) {
        match self {
            RunSched::Boxed(b) => b.as_mut(),
            RunSched::Message(p) => p,
        }
    }
}

/// Message vectors kept for reuse ([`Engine::message_spares`]): a window of
/// non-blocking messages in flight needs a set each, and taking them from
/// finished messages keeps a steady stream from allocating.
const MESSAGE_SPARES: usize = 1024;

struct Running {
    op: OpDesc,
    sched: RunSched,
    /// Under which key the schedule goes back to the cache (collectives).
    key: Option<sched_cache::Key>,
    /// The persistent operation this is a round of (`prepared.rs`): its
    /// schedule goes back to it, and its registrations stay.
    prepared: Option<u64>,
    /// Per transport: the send and receive buffers' registrations, made
    /// (or found among the caller's) when first used.
    handles: Vec<Option<OpMem>>,
    inflight: Vec<Inflight>,
    blocked: VecDeque<Action>,
    /// One-sided rounds (`prepared.rs`): the window, its registration per
    /// transport, and the round number stamped on immediates.
    window: (Ptr, usize),
    window_handles: Vec<Option<MemHandle>>,
    round: u8,
    /// `Landed` actions waiting for their immediate: (immediate, peer, id).
    expect: Vec<(u32, Rank, ActionId)>,
    /// Immediates that came before their `Landed` action was ready.
    arrived: Vec<Arrival>,
    /// When it times out. A point-to-point message has none until a
    /// caller waits for it.
    deadline: Option<Instant>,
    /// When the operation stops making progress long enough, it is posted
    /// on the board and compared with what the other ranks are doing.
    stalled_at: Instant,
    posted: bool,
    /// The operation's span (its sequence number and kind), entered while
    /// the engine works on it. DEBUG level: disabled, and free, unless
    /// `GW_DEBUG` asks for debug lines.
    span: tracing::Span,
    /// When it started, for `GW_TRACE` (0 when tracing is off).
    trace_us: f64,
}

impl Running {
    /// Its vectors, for another operation (see [`Spare`]).
    fn take_spare(&mut self) -> Spare {
        Spare {
            handles: std::mem::take(&mut self.handles),
            inflight: std::mem::take(&mut self.inflight),
            blocked: std::mem::take(&mut self.blocked),
            window_handles: std::mem::take(&mut self.window_handles),
            expect: std::mem::take(&mut self.expect),
            arrived: std::mem::take(&mut self.arrived),
        }
    }

    fn is_finished(&self) -> bool {
        self.sched.is_done() && self.inflight.is_empty() && self.blocked.is_empty()
    }

    /// Puts the finished operation on the `GW_TRACE` timeline.
    fn trace_done(&self) {
        if self.trace_us > 0.0 {
            let fp = &self.op.fp;
            let bytes = fp.count * fp.dtype.size() as u64;
            let lane = if fp.is_message() {
                trace::Lane::Message
            } else {
                trace::Lane::Collective
            };
            trace::record(fp.op.name(), lane, self.trace_us, fp.seq, bytes, None);
        }
    }
}

/// The vectors of a [`Running`] operation, kept between operations so that
/// starting one does not allocate them again. `Default` is the empty,
/// non-allocating value left behind while an operation holds them.
#[derive(Default)]
struct Spare {
    handles: Vec<Option<OpMem>>,
    inflight: Vec<Inflight>,
    blocked: VecDeque<Action>,
    window_handles: Vec<Option<MemHandle>>,
    expect: Vec<(u32, Rank, ActionId)>,
    arrived: Vec<Arrival>,
}

/// Room made up front for posted sends and receives. Kept vectors grow to
/// the most ever outstanding at once, and under flow control that high
/// mark can first be reached late in a job (a send waiting for its
/// receiver's go-ahead stays outstanding longer), which would allocate in
/// the steady state. A pipeline of the deepest depth to four peers, both
/// directions, fits; a few KiB per communicator.
const INFLIGHT_ROOM: usize = 2 * crate::algo::MAX_DEPTH * 4;

impl Spare {
    /// Empties the vectors, with a registration slot per transport, for
    /// another operation.
    fn ready_for(&mut self, transports: usize) {
        self.handles.clear();
        self.handles.resize(transports, None);
        self.inflight.clear();
        self.blocked.clear();
        self.window_handles.clear();
        self.window_handles.resize(transports, None);
        self.expect.clear();
        self.arrived.clear();
    }

    fn with_room() -> Self {
        Spare {
            handles: Vec::new(),
            inflight: Vec::with_capacity(INFLIGHT_ROOM),
            blocked: VecDeque::with_capacity(INFLIGHT_ROOM),
            window_handles: Vec::new(),
            expect: Vec::new(),
            arrived: Vec::new(),
        }
    }
}

/// A posted send or receive.
#[derive(Debug)]
struct Inflight {
    /// Index of the transport.
    t: usize,
    req: Request,
    id: ActionId,
    /// A receive into this scratch range, posted with `irecv_in_place`
    /// (see `in_place.rs`).
    in_place: Option<Loc>,
    /// For `GW_TRACE`: what it is, with whom, how large, posted when
    /// (0 when tracing is off).
    seg: Segment,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    kind: &'static str,
    peer: Rank,
    len: usize,
    posted_us: f64,
}

impl Segment {
    fn new(kind: &'static str, peer: Rank, len: usize) -> Segment {
        Segment {
            kind,
            peer,
            len,
            posted_us: if trace::enabled() {
                trace::now_us()
            } else {
                0.0
            },
        }
    }

    fn landed(&self, seq: u64) {
        if self.posted_us > 0.0 {
            trace::record(
                self.kind,
                trace::Lane::Transfer,
                self.posted_us,
                seq,
                self.len as u64,
                Some(self.peer),
            );
        }
    }
}

/// What one [`Engine::turn`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Something moved: turn again.
    Moved,
    /// Nothing moved, but not for `spin_us` yet: poll again soon.
    Spin,
    /// Nothing moved for `spin_us`: sleep in the poller, at most `timeout`.
    /// `idle`: no operation at all and nothing unsent (a submission is what
    /// ends the sleep).
    Sleep {
        timeout: Option<Duration>,
        idle: bool,
    },
    /// Shut down: nothing is queued and the communicator is gone.
    Exit,
}

/// Per driver: how long nothing has moved, and when the peers were checked.
pub(crate) struct TurnState {
    idle_since: Option<Instant>,
    last_check: Instant,
}

impl TurnState {
    pub fn new() -> TurnState {
        TurnState {
            idle_since: None,
            last_check: Instant::now(),
        }
    }

    /// After a sleep that a submission ended: spin again before the next one.
    pub fn woke(&mut self) {
        self.idle_since = None;
    }

    /// How long nothing has moved (zero while things move).
    pub fn idle_for(&self) -> Duration {
        self.idle_since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// Static engine settings.
pub(crate) struct EngineConfig {
    pub me: Rank,
    pub timeout: Duration,
    pub spin: Duration,
    pub oversubscribed: bool,
    pub hostnames: Vec<String>,
    /// Where failures and stalled operations are posted for every rank.
    pub board: Option<Board>,
}

/// What decides whether a queued message may start (see
/// `Engine::start_messages`): the queue, the messages running and
/// `current`. Between two looks `messages` only shrinks (it grows only
/// there), every change to the queue is counted, and `current` either
/// ends or is replaced by an operation taken out of the queue (counted
/// too), so an equal gate means that nothing which could hold a message
/// back has changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MessageGate {
    /// `Engine::queue_changes`.
    queue_changes: u64,
    messages: usize,
    current: bool,
}

/// The engine state, turned by one thread at a time (see `drive.rs`).
pub(crate) struct Engine {
    cfg: EngineConfig,
    transports: Vec<Box<dyn Transport>>,
    /// Transport index per peer rank.
    route: Vec<usize>,
    /// Per transport: whether it has one-sided writes (and so immediates
    /// to take), and whether hardware does them.
    one_sided: Vec<bool>,
    /// Per transport: whether it has one-sided reads.
    reads: Vec<bool>,
    offloaded: Vec<bool>,
    connected: Vec<bool>,
    rx: Receiver,
    abort: Arc<AtomicBool>,
    queue: VecDeque<OpDesc>,
    current: Option<Running>,
    /// Point-to-point messages in flight, beside `current`.
    messages: Vec<Running>,
    /// The transports' finished-request count when `messages` were last
    /// advanced (see `step_messages`); `None`: advance them next step.
    messages_seen: Option<u64>,
    /// What `start_messages` last left (see `MessageGate`).
    messages_gate: Option<MessageGate>,
    /// Operations put into or taken out of `queue` so far.
    queue_changes: u64,
    failed: Option<Error>,
    scratch: Vec<u64>,
    scratch_handles: Vec<Option<MemHandle>>,
    shutting_down: bool,
    schedules: ScheduleCache,
    spare: Spare,
    /// Vectors of finished messages, for the next ones (`MESSAGE_SPARES`).
    message_spares: Vec<Spare>,
    /// Persistent operations' plans (`prepared.rs`).
    prepared: Vec<prepared::Prepared>,
    /// Buffers the caller registered (`user_regs.rs`).
    user_regs: user_regs::UserRegs,
    /// The communicator's host region of small collectives, whose queued
    /// non-blocking calls every turn and every wait of the direct path
    /// posts once their slots free (`HostColl::pump`): a rank blocked here
    /// must still post rounds its peers wait for.
    host_coll: Option<Arc<HostColl>>,
}

impl Engine {
    /// Sets up the poller and attaches every transport to it. The poller
    /// goes to the engine's thread, the only one that sleeps in it.
    pub fn new(
        cfg: EngineConfig,
        mut transports: Vec<Box<dyn Transport>>,
        route: Vec<usize>,
        rx: Receiver,
        abort: Arc<AtomicBool>,
    ) -> Result<(Engine, Poll, Arc<Waker>)> {
        let poll = Poll::new().map_err(|e| Error::sys("epoll_create", "engine poller", e))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER)
                .map_err(|e| Error::sys("eventfd", "engine waker", e))?,
        );
        for (i, t) in transports.iter_mut().enumerate() {
            t.attach(poll.registry(), i << 32)?;
        }
        let n = route.len();
        let nt = transports.len();
        let one_sided = transports
            .iter()
            .map(|t| t.properties().one_sided_write)
            .collect();
        let offloaded = transports
            .iter()
            .map(|t| t.properties().offloaded_writes)
            .collect();
        let reads = transports
            .iter()
            .map(|t| t.properties().one_sided_read)
            .collect();
        let user_regs = user_regs::UserRegs::new(&transports);
        Ok((
            Engine {
                cfg,
                transports,
                route,
                one_sided,
                reads,
                offloaded,
                connected: vec![false; n],
                rx,
                abort,
                // Reserved: grown only where a burst first outnumbered every
                // earlier one, it grew in the middle of a steady state (a
                // 24-message window on 3 ranks, one run in a dozen:
                // tests/no_alloc.rs).
                queue: VecDeque::with_capacity(crate::bringup::QUEUE_CAPACITY),
                current: None,
                messages: Vec::new(),
                messages_seen: None,
                messages_gate: None,
                queue_changes: 0,
                failed: None,
                scratch: Vec::new(),
                scratch_handles: vec![None; nt],
                shutting_down: false,
                schedules: ScheduleCache::new(sched_cache::MAX_ENTRIES, sched_cache::MAX_BYTES),
                spare: Spare::with_room(),
                message_spares: Vec::new(),
                prepared: Vec::new(),
                user_regs,
                host_coll: None,
            },
            poll,
            waker,
        ))
    }

    /// One round of work: takes submissions, starts the next operation,
    /// moves bytes and schedules, and checks on stalled operations. Says
    /// what the driver should do next.
    pub fn turn(&mut self, st: &mut TurnState) -> Turn {
        self.pump_host();
        self.drain_messages();
        if self.abort.load(Ordering::Acquire) && self.failed.is_none() {
            self.fail(aborted());
        }
        self.start_messages();
        if self.current.is_none() {
            self.start_next();
        }
        let no_ops = self.no_ops();
        // Closing flushes what callers sent at once (`close`); otherwise
        // that is work, as a posted send would be.
        if no_ops && self.shutting_down {
            return Turn::Exit;
        }
        if no_ops && !self.unsent() && self.host_queued() {
            // Nothing of the engine's, but a queued small collective to
            // post once its slot frees: look again soon rather than park.
            return Turn::Sleep {
                timeout: Some(HOST_PUMP_EVERY),
                idle: false,
            };
        }
        if no_ops && !self.unsent() {
            let now = Instant::now();
            // Idle: a training loop submits its next operation within
            // microseconds of the last one finishing, so spin a little
            // (watching the channel and the peers) before sleeping until a
            // submission wakes us; a sleep and wake costs ~50 µs here.
            let since = *st.idle_since.get_or_insert(now);
            if now.duration_since(since) < self.cfg.spin {
                return Turn::Spin;
            }
            return Turn::Sleep {
                timeout: None,
                idle: true,
            };
        }
        match self.step() {
            Ok(true) => {
                st.idle_since = None;
                return Turn::Moved;
            }
            Ok(false) => {}
            Err(e) => {
                let e = self.explain(e);
                self.fail(e);
                return Turn::Moved;
            }
        }
        // Read the clock only when nothing moved: a moving operation needs
        // no timing, and the clock read costs as much as a small step.
        let now = Instant::now();
        self.arm_waited_messages(now);
        let since = *st.idle_since.get_or_insert(now);
        // Checks (the board is a store round trip, and allocates) wait
        // until the operation has stalled: a failure elsewhere shows as a
        // stall here, and operations that progress need no checking, so a
        // steady-state step stays free of them. Past the deadline, check
        // at once (the timeout is reported from there).
        let stalled = now.duration_since(since) >= PEER_CHECK_EVERY
            && now.duration_since(st.last_check) >= PEER_CHECK_EVERY;
        let late = self.next_deadline().is_some_and(|d| now >= d);
        if stalled || late {
            st.last_check = now;
            STALL_CHECKS.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.check() {
                self.fail(e);
                return Turn::Moved;
            }
        }
        if now.duration_since(since) < self.cfg.spin {
            return Turn::Spin;
        }
        // With nothing but unsent bytes to wait for, a peer that never
        // reads would leave no deadline: look again as a stalled
        // operation's checks would, so that the thread still turns (and a
        // persistent round left for its wait is taken over).
        let only_unsent = self.no_ops();
        Turn::Sleep {
            timeout: self
                .next_deadline()
                .map(|d| d.saturating_duration_since(now).min(PEER_CHECK_EVERY))
                .or(only_unsent.then_some(PEER_CHECK_EVERY)),
            idle: false,
        }
    }

    /// Hands the engine the communicator's host region of small
    /// collectives (see `host_coll`).
    pub(crate) fn set_host_coll(&mut self, h: Arc<HostColl>) {
        self.host_coll = Some(h);
    }

    fn host_queued(&self) -> bool {
        self.host_coll.as_ref().is_some_and(|h| h.has_queued())
    }

    /// Posts what the host region's queued calls allow (see `host_coll`).
    pub(crate) fn pump_host(&self) {
        if let Some(h) = &self.host_coll
            && h.has_queued()
        {
            h.pump();
        }
    }

    /// Starts the timeout of every message a caller now waits for.
    fn arm_waited_messages(&mut self, now: Instant) {
        let timeout = self.cfg.timeout;
        for r in self.messages.iter_mut().filter(|r| r.deadline.is_none()) {
            if r.op.done.is_waited() {
                r.deadline = Some(now + timeout);
            }
        }
    }

    /// The earliest deadline of the operations running.
    fn next_deadline(&self) -> Option<Instant> {
        self.current
            .iter()
            .chain(&self.messages)
            .filter_map(|r| r.deadline)
            .min()
    }

    /// Whether more threads than cores run ranks here (spinners should yield).
    pub fn oversubscribed(&self) -> bool {
        self.cfg.oversubscribed
    }

    /// Queues an operation behind every one already submitted (a deferred
    /// persistent round the engine thread takes over).
    pub(crate) fn queue_after_submitted(&mut self, op: OpDesc) {
        self.drain_messages();
        self.queue.push_back(op);
        self.queue_changes += 1;
    }

    /// Whether nothing is running, queued (submissions still in the
    /// channel count as queued) or left unsent by a transport.
    pub fn is_idle(&mut self) -> bool {
        self.drain_messages();
        self.no_ops() && !self.unsent()
    }

    /// Whether no operation is running or queued (as of the last drain of
    /// the channel).
    fn no_ops(&self) -> bool {
        self.current.is_none() && self.queue.is_empty() && self.messages.is_empty()
    }

    /// Whether a transport still holds part of a message that a caller
    /// sent at once and returned from (`Transport::unsent`): the engine
    /// keeps progressing until it is out, as it would for a posted send.
    fn unsent(&self) -> bool {
        self.transports.iter().any(|t| t.unsent())
    }

    /// Has every transport make its per-thread state on the calling
    /// thread (the engine thread, at its start: `Transport::prepare_thread`).
    pub fn prepare_thread(&self) {
        for t in &self.transports {
            t.prepare_thread();
        }
    }

    /// Arms every transport's wakeups before the driver sleeps in the
    /// poller; `false` if work is already waiting.
    pub fn prepare_sleep(&mut self) -> bool {
        let mut ok = true;
        for t in &mut self.transports {
            ok &= t.prepare_sleep();
        }
        ok
    }

    /// Disarms the wakeups again (after a sleep, or before a thread that
    /// does not watch the poller drives: a peer would ring for nothing).
    pub fn finish_sleep(&mut self) {
        for t in &mut self.transports {
            t.finish_sleep();
        }
    }

    /// The driver does not watch the poller: have every transport look at
    /// all its connections (see [`Transport::poke`]).
    pub fn poke(&mut self) {
        for t in &mut self.transports {
            t.poke();
        }
    }

    /// Hands the poller's events to the transports they belong to.
    pub fn dispatch(&mut self, events: &Events) {
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            let idx = ev.token().0 >> 32;
            if let Some(t) = self.transports.get_mut(idx)
                && let Err(e) = t.on_event(ev)
            {
                self.fail(e);
                return;
            }
        }
    }

    /// The poller failed: nothing can wait for the peers any more.
    pub fn poll_failed(&mut self, e: std::io::Error) {
        self.fail(Error::sys("epoll_wait", "engine poller", e));
    }

    /// Leaves the peers cleanly (close notices) once the communicator is gone.
    pub fn close(&mut self) {
        // What callers sent at once and returned from goes out first, for
        // as long as the peers take it within `CLOSE_FLUSH`.
        let deadline = Instant::now() + CLOSE_FLUSH;
        while self.unsent() && self.failed.is_none() && Instant::now() < deadline {
            let mut moved = false;
            // Only those holding bytes: a NIC provider may not take a
            // progress call well at shutdown.
            for t in self.transports.iter_mut().filter(|t| t.unsent()) {
                t.poke();
                match t.progress() {
                    Ok(m) => moved |= m,
                    Err(e) => {
                        tracing::warn!("a message sent at once did not all go out: {e}");
                        self.transports.clear();
                        return;
                    }
                }
            }
            if !moved {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.transports.clear();
    }

    fn drain_messages(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Op(op)) => {
                    if let Plan::Unprepare(id) = op.plan
                        && self.failed.is_some()
                    {
                        // Nothing runs any more, but the buffers may go away:
                        // forget them now.
                        op.done.finish(self.unprepare(id));
                    } else if let Plan::Deregister(id) = op.plan
                        && self.failed.is_some()
                    {
                        op.done.finish(self.deregister_user(id));
                    } else if let Plan::Register { id } = op.plan {
                        // At once: it waits for nothing (see user_regs.rs).
                        op.done
                            .finish(self.register_user(id, op.recv, op.recv_bytes));
                    } else if let Some(e) = &self.failed {
                        op.done.finish(Err(failed_earlier(e)));
                    } else {
                        self.queue.push_back(op);
                        self.queue_changes += 1;
                    }
                }
                Ok(Msg::Shutdown) | Err(TryRecvError::Disconnected) => self.shutting_down = true,
                Err(TryRecvError::Empty) => break,
            }
        }
    }

    fn check(&mut self) -> Result<()> {
        self.check_links()?;
        // Messages are never compared with what other ranks do (they need
        // not agree on an order), but the board still says who failed.
        if let Some(r) = self.current.as_mut().or(self.messages.first_mut()) {
            let stalled = Instant::now() >= r.stalled_at;
            let me = self.cfg.me;
            if let Some(e) =
                consult_board(&mut self.cfg.board, me, &r.op.fp, stalled, &mut r.posted)
            {
                return Err(e);
            }
            if stalled
                && let Some(e) = self
                    .host_coll
                    .as_ref()
                    .and_then(|h| h.here_instead(&r.op.fp))
            {
                return Err(e);
            }
        }
        let now = Instant::now();
        if let Some(i) = self
            .current
            .iter()
            .chain(&self.messages)
            .position(|r| r.deadline.is_some_and(|d| now >= d))
        {
            let others = self.others_doing();
            if let Some(r) = self.current.iter().chain(&self.messages).nth(i) {
                return Err(Error::Timeout {
                    secs: self.cfg.timeout.as_secs_f64(),
                    what: format!(
                        "in {} on rank {}: {}{others}",
                        r.op.fp,
                        self.cfg.me,
                        self.describe_wait(r)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Asks every transport whether its peers are still alive.
    fn check_links(&mut self) -> Result<()> {
        for i in 0..self.transports.len() {
            if let Err(e) = self.transports[i].check_peers() {
                // A peer that failed posts why before it exits; that cause
                // explains its death better than the death itself.
                if let Some(Ok(Some(why))) = self.cfg.board.as_mut().map(|b| b.failure()) {
                    return Err(Error::Aborted(format!("another rank failed: {why}")));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// A peer's connection broke: if another rank posted a failure, that
    /// is the cause (a rank that failed first closes its connections, so
    /// its neighbours see a broken pipe before they hear why).
    fn explain(&mut self, e: Error) -> Error {
        if !matches!(e, Error::Remote { .. }) {
            return e;
        }
        match self.cfg.board.as_mut().map(|b| b.failure()) {
            Some(Ok(Some(why))) => Error::Aborted(format!("another rank failed: {why}")),
            _ => e,
        }
    }

    /// What the other ranks posted, for timeout errors.
    fn others_doing(&mut self) -> String {
        let me = self.cfg.me;
        let Some(board) = self.cfg.board.as_mut() else {
            return String::new();
        };
        match board.others(me) {
            Ok(v) if !v.is_empty() => {
                let list: Vec<String> = v
                    .iter()
                    .take(16)
                    .map(|d| format!("rank {} in {}", d.rank, d.what))
                    .collect();
                format!("; stalled ranks: {}", list.join(", "))
            }
            _ => String::new(),
        }
    }

    fn describe_wait(&self, r: &Running) -> String {
        let mut s = r.sched.waiting_for();
        if let Some(a) = r.blocked.front() {
            let peer = match a {
                Action::Send { peer, .. }
                | Action::Recv { peer, .. }
                | Action::Write { peer, .. }
                | Action::Read { peer, .. }
                | Action::Landed { peer, .. } => *peer,
                _ => self.cfg.me,
            };
            s.push_str(&format!(
                "; still connecting to rank {peer} ({})",
                self.cfg
                    .hostnames
                    .get(peer as usize)
                    .map(String::as_str)
                    .unwrap_or("?")
            ));
        }
        s
    }

    fn start_next(&mut self) {
        // Not while a message still uses its memory (see the module comment).
        if self.failed.is_none()
            && let Some(front) = self.queue.front()
            && self.messages.iter().any(|m| m.op.conflicts(front))
        {
            return;
        }
        let Some(mut op) = self.queue.pop_front() else {
            return;
        };
        self.queue_changes += 1;
        if let Some(e) = &self.failed {
            op.done.finish(Err(failed_earlier(e)));
            return;
        }
        // A schedule that cannot be built (the arguments were checked, so only
        // limits such as 32-bit step numbers remain) fails its operation the
        // same way on every rank, as a scratch allocation failure does.
        let nt = self.transports.len();
        let mut spare = std::mem::take(&mut self.spare);
        spare.ready_for(nt);
        let mut window = (Ptr(std::ptr::null_mut()), 0);
        let mut round = 0u8;
        let (sched, key, prepared) = match std::mem::replace(&mut op.plan, Plan::Started) {
            Plan::Collective(spec, algo) => {
                let key = (spec, algo);
                match self.schedules.take(&key) {
                    Ok(s) => (RunSched::Boxed(s), Some(key), None),
                    Err(e) => {
                        self.spare = spare;
                        op.done.finish(Err(e));
                        return;
                    }
                }
            }
            Plan::Built(s) => (RunSched::Boxed(s), None, None),
            Plan::Message(p) => (RunSched::Message(p), None, None),
            Plan::Prepared(id) => match self.take_prepared(id, &op, &mut spare) {
                Ok((s, w, rd)) => {
                    (window, round) = (w, rd);
                    (RunSched::Boxed(s), None, Some(id))
                }
                Err(e) => {
                    self.spare = spare;
                    op.done.finish(Err(e));
                    return;
                }
            },
            Plan::Prepare {
                id,
                sched,
                one_sided,
                offloaded_only,
                out,
            } => {
                self.spare = spare;
                let os = one_sided.map(|s| (s, offloaded_only));
                let res = self.prepare(&op, id, sched, os, &out);
                op.done.finish(res);
                return;
            }
            Plan::Attach { id, remotes } => {
                self.spare = spare;
                let res = self.attach(id, remotes);
                op.done.finish(res);
                return;
            }
            Plan::Unprepare(id) => {
                self.spare = spare;
                let res = self.unprepare(id);
                op.done.finish(res);
                return;
            }
            Plan::Deregister(id) => {
                self.spare = spare;
                let res = self.deregister_user(id);
                op.done.finish(res);
                return;
            }
            Plan::Started => {
                self.spare = spare;
                op.done
                    .finish(Err(Error::Internal("operation started twice".into())));
                return;
            }
            // `drain_messages` runs a registration when it takes it.
            Plan::Register { .. } => {
                self.spare = spare;
                op.done
                    .finish(Err(Error::Internal("a registration was queued".into())));
                return;
            }
        };
        let need = sched.scratch_elems() * op.kernel.dtype.size();
        if let Err(e) = self.ensure_scratch(need) {
            if let (Some(id), Some(s)) = (prepared, sched.into_boxed()) {
                self.put_prepared(id, s);
            }
            self.spare = spare;
            op.done.finish(Err(e));
            return;
        }
        // Told to the host region's waiters (see `host_coll`).
        if let Some(h) = &self.host_coll {
            h.note_engine_call(&op.fp);
        }
        self.current = Some(self.running(op, sched, key, prepared, window, round, spare));
    }

    /// Starts every point-to-point message queued, wherever it stands in
    /// the queue (it waits for nothing the other ranks order), unless an
    /// earlier operation still to end touches its memory.
    fn start_messages(&mut self) {
        // Only what was queued, finished or started since the last look can
        // let a message start, and looking costs a pass over the queue
        // against everything running: with a window of messages into one
        // buffer, each held back by the one before, that pass on every turn
        // was an eighth of a 64 KiB receiver's time.
        let gate = self.message_gate();
        if self.messages_gate == Some(gate) {
            return;
        }
        self.start_queued_messages();
        self.messages_gate = Some(self.message_gate());
    }

    fn message_gate(&self) -> MessageGate {
        MessageGate {
            queue_changes: self.queue_changes,
            messages: self.messages.len(),
            current: self.current.is_some(),
        }
    }

    fn start_queued_messages(&mut self) {
        if self.failed.is_some() || !self.queue.iter().any(|op| op.fp.is_message()) {
            return;
        }
        let nt = self.transports.len();
        let mut i = 0;
        while i < self.queue.len() {
            if !self.queue[i].fp.is_message() || self.held_back(i) {
                i += 1;
                continue;
            }
            let Some(mut op) = self.queue.remove(i) else {
                break;
            };
            self.queue_changes += 1;
            match std::mem::replace(&mut op.plan, Plan::Started) {
                Plan::Message(p) => {
                    let mut spare = self.message_spares.pop().unwrap_or_default();
                    spare.ready_for(nt);
                    let mut r = self.running(
                        op,
                        RunSched::Message(p),
                        None,
                        None,
                        (Ptr(std::ptr::null_mut()), 0),
                        0,
                        spare,
                    );
                    // Its timeout starts when someone waits for it.
                    r.deadline = None;
                    self.messages.push(r);
                    // Its first advance posts it.
                    self.messages_seen = None;
                }
                _ => op.done.finish(Err(Error::Internal(
                    "a point-to-point message without its schedule".into(),
                ))),
            }
        }
    }

    /// Whether queued operation `i` touches memory that the running
    /// operations, or those queued before it, still use.
    fn held_back(&self, i: usize) -> bool {
        let op = &self.queue[i];
        self.current
            .iter()
            .chain(&self.messages)
            .map(|r| &r.op)
            .chain(self.queue.iter().take(i))
            .any(|earlier| earlier.conflicts(op))
    }

    /// An operation about to run, holding `spare`'s vectors.
    #[allow(clippy::too_many_arguments)]
    fn running(
        &self,
        op: OpDesc,
        sched: RunSched,
        key: Option<sched_cache::Key>,
        prepared: Option<u64>,
        window: (Ptr, usize),
        round: u8,
        spare: Spare,
    ) -> Running {
        let span = tracing::debug_span!("op", seq = op.fp.seq, op = op.fp.op.name());
        Running {
            span,
            op,
            sched,
            key,
            prepared,
            handles: spare.handles,
            inflight: spare.inflight,
            blocked: spare.blocked,
            window,
            window_handles: spare.window_handles,
            round,
            expect: spare.expect,
            arrived: spare.arrived,
            deadline: Some(Instant::now() + self.cfg.timeout),
            stalled_at: Instant::now() + (self.cfg.timeout / 8).min(STALL),
            posted: false,
            trace_us: if trace::enabled() {
                trace::now_us()
            } else {
                0.0
            },
        }
    }

    /// Grows the communicator's scratch buffer (rarely: it only ever grows) and
    /// registers it with every transport.
    fn ensure_scratch(&mut self, bytes: usize) -> Result<()> {
        if bytes <= self.scratch.len() * 8 {
            return Ok(());
        }
        for (t, h) in self
            .transports
            .iter_mut()
            .zip(self.scratch_handles.iter_mut())
        {
            if let Some(h) = h.take() {
                t.deregister(h)?;
            }
        }
        self.scratch = vec![0u64; bytes.div_ceil(8).next_power_of_two()];
        let ptr = self.scratch.as_mut_ptr().cast::<u8>();
        let len = self.scratch.len() * 8;
        for (t, h) in self
            .transports
            .iter_mut()
            .zip(self.scratch_handles.iter_mut())
        {
            // SAFETY: the scratch vector lives until it is deregistered here or the engine drops.
            *h = Some(unsafe { t.register(ptr, len)? });
            REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Progresses transports and the running operation once.
    fn step(&mut self) -> Result<bool> {
        let mut moved = false;
        for t in &mut self.transports {
            moved |= t.progress()?;
        }
        if !self.messages.is_empty() {
            moved |= self.step_messages()?;
        }
        let Some(mut r) = self.current.take() else {
            return Ok(moved);
        };
        let span = r.span.clone();
        let res = span.in_scope(|| self.advance(&mut r));
        match res {
            Ok(m) => {
                moved |= m;
                if r.is_finished() {
                    r.trace_done();
                    self.release(&mut r);
                    self.retire(r).finish(Ok(()));
                    moved = true;
                } else {
                    self.current = Some(r);
                }
                Ok(moved)
            }
            Err(e) => {
                // Released by fail(), which the caller runs next, after it
                // aborts the transports: deregistering now, with transfers
                // still posted, would be refused and leave the memory
                // registered (pinned, on a NIC).
                self.current = Some(r);
                Err(e)
            }
        }
    }

    /// Every transport's count of finished requests, summed; `None` if one
    /// does not count (see `Transport::finished`).
    fn finished_requests(&self) -> Option<u64> {
        self.transports
            .iter()
            .try_fold(0u64, |sum, t| Some(sum.wrapping_add(t.finished()?)))
    }

    /// Advances every point-to-point message in flight, finishing those
    /// that are done. A message that has posted everything it can waits
    /// only for its requests to finish: while no transport finished one
    /// since the last pass (counted before it, so that one finishing
    /// during the pass brings another), the pass is skipped. Messages
    /// waiting for a connection or for immediates are passed every step.
    fn step_messages(&mut self) -> Result<bool> {
        let finished = self.finished_requests();
        if finished.is_some() && finished == self.messages_seen {
            return Ok(false);
        }
        self.messages_seen = finished;
        let mut moved = false;
        let mut messages = std::mem::take(&mut self.messages);
        let mut i = 0;
        let mut res = Ok(());
        while i < messages.len() {
            let span = messages[i].span.clone();
            match span.in_scope(|| self.advance(&mut messages[i])) {
                Ok(m) => moved |= m,
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
            if !messages[i].blocked.is_empty() || !messages[i].expect.is_empty() {
                self.messages_seen = None;
            }
            if messages[i].is_finished() {
                let mut r = messages.swap_remove(i);
                r.trace_done();
                self.release(&mut r);
                r.op.done.finish(Ok(()));
                self.keep_message_spare(r);
                moved = true;
            } else {
                i += 1;
            }
        }
        // Those left (all of them, on an error) stay for fail() to finish.
        self.messages = messages;
        res.map(|()| moved)
    }

    fn advance(&mut self, r: &mut Running) -> Result<bool> {
        let mut moved = false;
        loop {
            let mut progressed = false;
            for _ in 0..r.blocked.len() {
                let Some(a) = r.blocked.pop_front() else {
                    break;
                };
                progressed |= self.execute(r, a)?;
            }
            while let Some(a) = r.sched.next_action() {
                self.execute(r, a)?;
                progressed = true;
            }
            if !r.expect.is_empty() {
                progressed |= self.take_imms(r)?;
            }
            let mut i = 0;
            while i < r.inflight.len() {
                // Testing consumes the request: take it out, and put it
                // back where it was while it is pending (the push after a
                // swap_remove stays within the vector's capacity).
                let f = r.inflight.swap_remove(i);
                let Inflight {
                    t,
                    id,
                    in_place,
                    seg,
                    ..
                } = f;
                match self.transports[t].test_in_place(f.req)? {
                    Landed::Pending(req) => {
                        r.inflight.push(Inflight {
                            t,
                            req,
                            id,
                            in_place,
                            seg,
                        });
                        let last = r.inflight.len() - 1;
                        r.inflight.swap(i, last);
                        i += 1;
                    }
                    Landed::Written => {
                        seg.landed(r.op.fp.seq);
                        r.sched.complete(id);
                        progressed = true;
                    }
                    Landed::InPlace { at, held } => {
                        seg.landed(r.op.fp.seq);
                        self.consume_in_place(r, t, id, in_place, held, at)?;
                        progressed = true;
                    }
                }
            }
            if !progressed {
                return Ok(moved);
            }
            moved = true;
        }
    }

    /// Carries out one action. Returns false if it had to wait for a connection.
    fn execute(&mut self, r: &mut Running, a: Action) -> Result<bool> {
        match a {
            Action::Send {
                id,
                peer,
                step,
                src,
            }
            | Action::Recv {
                id,
                peer,
                step,
                dst: src,
            } => {
                let t = self.ready_transport(peer)?;
                let Some(t) = t else {
                    r.blocked.push_back(a);
                    return Ok(false);
                };
                let (mem, off, len) = self.locate(r, t, src)?;
                let tag = r.op.fp.tag(step);
                // A receive into scratch is read once, by what comes next in
                // the schedule: it may as well read the bytes where they
                // arrived (see `in_place.rs`).
                let (req, in_place) = match a {
                    Action::Send { .. } => {
                        SENDS.fetch_add(1, Ordering::Relaxed);
                        // A reduce's sender is idle while its parent reduces
                        // what it sent: with a core of its own it moves the
                        // bytes itself, beside the parent's reduction (see
                        // `SendHint::Pushed`; pulled, a 2-rank 1 MiB
                        // reduce over shm ran 0.66x as fast). Where ranks
                        // share cores nothing runs beside, and one copy costs
                        // less.
                        // Both halves of a sendrecv with one peer keep both
                        // ranks busy: one copy of each message beats two
                        // however large (`SendHint::Exchanged`), and so does
                        // a 2-rank all-gather's while its output stays
                        // cached (`all_gather_pulled`). Any other
                        // point-to-point message is only stored where it
                        // lands (`SendHint::Stored`). Where ranks share
                        // cores, so do a large broadcast's and all-gather's
                        // receivers, and the transport pulls those from a
                        // threshold of its own where that pays
                        // (`config::STORED_PULLED_OUTPUT_SHARED_CORES`), but
                        // for a fan-out broadcast's, whose receivers would
                        // all pin the root's pages at once
                        // (`config::hint_where_cores_shared`).
                        let hint = if self.cfg.oversubscribed {
                            crate::config::hint_where_cores_shared(
                                r.op.fp.op,
                                r.op.recv_bytes,
                                r.key.as_ref().is_some_and(|k| k.0.fan_out),
                            )
                        } else if r.op.fp.op == OpKind::Reduce {
                            Some(SendHint::Pushed)
                        } else if r.sched.exchanges_with(peer)
                            || (r.op.fp.op == OpKind::AllGather
                                && crate::config::all_gather_pulled(
                                    self.cfg.hostnames.len(),
                                    r.op.recv_bytes,
                                ))
                        {
                            Some(SendHint::Exchanged)
                        } else if r.op.fp.op == OpKind::SendRecv {
                            Some(SendHint::Stored)
                        } else {
                            None
                        };
                        let tr = &mut self.transports[t];
                        let req = match hint {
                            Some(h) => tr.isend_hinted(peer, tag, mem, off, len, h)?,
                            None => tr.isend(peer, tag, mem, off, len)?,
                        };
                        (req, None)
                    }
                    _ if src.buf == Buf::Scratch => (
                        self.transports[t].irecv_in_place(peer, tag, mem, off, len)?,
                        Some(src),
                    ),
                    _ => (self.transports[t].irecv(peer, tag, mem, off, len)?, None),
                };
                let kind = if matches!(a, Action::Send { .. }) {
                    "send"
                } else {
                    "recv"
                };
                r.inflight.push(Inflight {
                    t,
                    req,
                    id,
                    in_place,
                    seg: Segment::new(kind, peer, len),
                });
            }
            Action::Reduce {
                id,
                dst,
                a: x,
                b: y,
                finalize,
            } => {
                self.reduce(r, dst, x, y, finalize, None)?;
                r.sched.complete(id);
            }
            Action::Write {
                id,
                peer,
                src,
                dst,
                imm,
            } => {
                let Some(t) = self.ready_transport(peer)? else {
                    r.blocked.push_back(a);
                    return Ok(false);
                };
                let (mem, offset, len) = self.locate(r, t, src)?;
                let remote = self.remote_of(r, peer, dst.buf)?;
                let es = r.op.kernel.dtype.size() as u64;
                let w = WriteImm {
                    mem,
                    offset,
                    len,
                    remote,
                    remote_offset: dst.offset as u64 * es,
                    imm: stamp_round(imm, r.round),
                };
                let req = self.transports[t].write_imm(peer, &w)?;
                WRITES.fetch_add(1, Ordering::Relaxed);
                r.inflight.push(Inflight {
                    t,
                    req,
                    id,
                    in_place: None,
                    seg: Segment::new("write", peer, len),
                });
            }
            Action::Read { id, peer, src, dst } => {
                let Some(t) = self.ready_transport(peer)? else {
                    r.blocked.push_back(a);
                    return Ok(false);
                };
                let (mem, offset, len) = self.locate(r, t, dst)?;
                let remote = self.remote_of(r, peer, src.buf)?;
                let es = r.op.kernel.dtype.size() as u64;
                let rd = ReadFrom {
                    mem,
                    offset,
                    len,
                    remote,
                    remote_offset: src.offset as u64 * es,
                };
                let req = self.transports[t].read(peer, &rd)?;
                r.inflight.push(Inflight {
                    t,
                    req,
                    id,
                    in_place: None,
                    seg: Segment::new("read", peer, len),
                });
            }
            Action::Landed { id, peer, imm, .. } => {
                let imm = stamp_round(imm, r.round);
                match r
                    .arrived
                    .iter()
                    .position(|a| a.imm == imm && a.from.is_none_or(|f| f == peer))
                {
                    Some(i) => {
                        r.arrived.swap_remove(i);
                        r.sched.complete(id);
                    }
                    None => r.expect.push((imm, peer, id)),
                }
            }
            Action::Copy {
                id,
                dst,
                src,
                finalize,
            } => {
                if src.len != dst.len {
                    return Err(Error::Internal(format!("copy with unequal lengths: {a:?}")));
                }
                let (d, s) = (self.ptr(r, dst)?, self.ptr(r, src)?);
                let sc = self.scale(r, src);
                // SAFETY: as for Reduce.
                unsafe { r.op.kernel.copy(d, s, sc, dst.len, finalize) };
                r.sched.complete(id);
            }
        }
        Ok(true)
    }

    /// Carries out `dst = x ⊕ y`; an operand equal to `view.0` is read at
    /// `view.1` instead (a message left in place, see `in_place.rs`).
    fn reduce(
        &self,
        r: &Running,
        dst: Loc,
        x: Loc,
        y: Loc,
        finalize: bool,
        view: Option<(Loc, *const u8)>,
    ) -> Result<()> {
        let n = dst.len;
        if x.len != n || y.len != n {
            return Err(Error::Internal(format!(
                "reduce with unequal lengths: {dst:?} = {x:?} + {y:?}"
            )));
        }
        let at = |l: Loc| -> Result<*const u8> {
            match view {
                Some((v, p)) if v == l => Ok(p),
                _ => Ok(self.ptr(r, l)?),
            }
        };
        let (d, xs, ys) = (self.ptr(r, dst)?, at(x)?, at(y)?);
        let (sx, sy) = (self.scale(r, x), self.scale(r, y));
        // SAFETY: ptr() bounds-checked each range against its buffer, and a
        // view holds the `len` elements of its range; the schedule guarantees
        // dst aliases a or b exactly or not at all, and a view aliases
        // nothing the engine writes.
        unsafe { r.op.kernel.reduce(d, xs, sx, ys, sy, n, finalize) };
        Ok(())
    }

    /// Takes the immediates that have come, completing the `Landed`
    /// actions they are for and keeping the others for actions not ready
    /// yet. Returns whether any arrived.
    fn take_imms(&mut self, r: &mut Running) -> Result<bool> {
        let mut got = false;
        for t in 0..self.transports.len() {
            if !self.one_sided[t] {
                continue;
            }
            while let Some(a) = self.transports[t].next_imm()? {
                got = true;
                if let Some(i) = r.expect.iter().position(|e| e.0 == a.imm) {
                    let (_, peer, id) = r.expect.swap_remove(i);
                    if let Some(from) = a.from.filter(|&f| f != peer) {
                        return Err(Error::Protocol(format!(
                            "rank {from} wrote with immediate {:#010x}, which rank {peer} was to write",
                            a.imm
                        )));
                    }
                    r.sched.complete(id);
                    continue;
                }
                if let Imm::Window { round, .. } = Imm::decode(a.imm)
                    && round != r.round
                {
                    let who = a.from.map_or("a peer".to_string(), |f| format!("rank {f}"));
                    return Err(Error::Protocol(format!(
                        "{who} wrote for round {round} of a persistent operation in its round {} (immediate {:#010x}): the ranks disagree on how many rounds were started",
                        r.round, a.imm
                    )));
                }
                r.arrived.push(a);
            }
        }
        Ok(got)
    }

    fn scale(&self, r: &Running, l: Loc) -> Option<f64> {
        if l.buf == Buf::Send {
            r.op.weight
        } else {
            None
        }
    }

    /// The transport to `peer` once its connection is up (`None` while pending).
    fn ready_transport(&mut self, peer: Rank) -> Result<Option<usize>> {
        let p = peer as usize;
        let t = *self.route.get(p).ok_or_else(|| {
            Error::Internal(format!("schedule addressed rank {peer} outside the world"))
        })?;
        if self.connected[p] {
            return Ok(Some(t));
        }
        match self.transports[t].connect(peer)? {
            Readiness::Ready => {
                self.connected[p] = true;
                tracing::info!(
                    "connected to rank {peer} ({}) over {}",
                    self.cfg.hostnames.get(p).map(String::as_str).unwrap_or("?"),
                    self.transports[t].properties().name
                );
                Ok(Some(t))
            }
            Readiness::Pending => Ok(None),
        }
    }

    fn buf_range(&self, r: &Running, l: Loc) -> Result<(Ptr, usize, usize)> {
        let es = r.op.kernel.dtype.size();
        let (base, size) = match l.buf {
            Buf::Send => (r.op.send, r.op.send_bytes),
            Buf::Recv => (r.op.recv, r.op.recv_bytes),
            Buf::Scratch => (
                Ptr(self.scratch.as_ptr() as *mut u8),
                self.scratch.len() * 8,
            ),
            Buf::Window => r.window,
        };
        let off = l.offset.checked_mul(es);
        let len = l.len.checked_mul(es);
        match (off, len) {
            (Some(o), Some(n)) if o.checked_add(n).is_some_and(|e| e <= size) => Ok((base, o, n)),
            _ => Err(Error::Internal(format!(
                "schedule range {l:?} exceeds its {size}-byte buffer"
            ))),
        }
    }

    fn ptr(&self, r: &Running, l: Loc) -> Result<*mut u8> {
        let (base, off, _) = self.buf_range(r, l)?;
        // SAFETY: buf_range checked off + len <= size of the buffer.
        Ok(unsafe { base.0.add(off) })
    }

    fn locate(&mut self, r: &mut Running, t: usize, l: Loc) -> Result<(MemHandle, usize, usize)> {
        let (_, off, len) = self.buf_range(r, l)?;
        let mem = match l.buf {
            Buf::Scratch => self.scratch_handles[t]
                .ok_or_else(|| Error::Internal("scratch used before it was registered".into()))?,
            Buf::Window => r.window_handles[t].ok_or_else(|| {
                Error::Internal("a window used by a transport it is not registered with".into())
            })?,
            Buf::Send | Buf::Recv => {
                let m = self.op_mem(r, t)?;
                let m = if l.buf == Buf::Send { m.send } else { m.recv };
                return Ok((m.handle, m.offset + off, len));
            }
        };
        Ok((mem, off, len))
    }

    /// Keeps a finished message's vectors for the next message.
    fn keep_message_spare(&mut self, mut r: Running) {
        if self.message_spares.len() < MESSAGE_SPARES {
            self.message_spares.push(r.take_spare());
        }
    }

    /// Keeps what a finished operation leaves that the next one can reuse
    /// (its schedule, in the cache; its vectors) and returns its completion,
    /// for the caller to finish.
    fn retire(&mut self, mut r: Running) -> Arc<Completion> {
        self.spare = r.take_spare();
        match (r.prepared, r.key, r.sched.into_boxed()) {
            (Some(id), _, Some(s)) => self.put_prepared(id, s),
            (None, Some(key), Some(s)) => self.schedules.put(key, s),
            _ => {}
        }
        r.op.done
    }

    fn release(&mut self, r: &mut Running) {
        if r.prepared.is_some() {
            // Lent by the persistent operation, which keeps them.
            for h in r.handles.iter_mut() {
                h.take();
            }
            for h in r.window_handles.iter_mut() {
                h.take();
            }
            r.window = (Ptr(std::ptr::null_mut()), 0);
            return;
        }
        for t in 0..r.handles.len() {
            if let Some(m) = r.handles[t].take() {
                self.give_back(t, m.send);
                self.give_back(t, m.recv);
            }
        }
    }

    fn fail(&mut self, e: Error) {
        if self.failed.is_some() {
            return;
        }
        match &self.current {
            Some(r) => tracing::warn!(seq = r.op.fp.seq, "communicator failed: {e}"),
            None => tracing::warn!("communicator failed: {e}"),
        }
        let reason = format!("rank {} failed: {e}", self.cfg.me);
        for t in &mut self.transports {
            t.abort(&reason);
        }
        // Ranks waiting for this one's rounds on the host region stop too.
        if let Some(h) = &self.host_coll {
            h.leave(crate::host_rounds::Leaving::Failed);
        }
        // Post the first failure for everyone; a rank that learnt of the failure
        // from the board itself leaves the original cause in place.
        if !matches!(e, Error::Aborted(_))
            && let Some(board) = self.cfg.board.as_mut()
        {
            let _ = board.post_failure(&reason);
        }
        if let Some(mut r) = self.current.take() {
            self.release(&mut r);
            if let (Some(id), Some(s)) = (r.prepared, r.sched.into_boxed()) {
                self.put_prepared(id, s);
            }
            r.op.done.finish(Err(e.clone()));
        }
        for mut r in std::mem::take(&mut self.messages) {
            self.release(&mut r);
            r.op.done.finish(Err(e.clone()));
        }
        self.failed = Some(e.clone());
        self.queue_changes += 1;
        for op in std::mem::take(&mut self.queue) {
            match op.plan {
                // Nothing runs any more, but the buffers may go away: let
                // their registrations go now, as for one that comes later.
                Plan::Unprepare(id) => op.done.finish(self.unprepare(id)),
                Plan::Deregister(id) => op.done.finish(self.deregister_user(id)),
                _ => op.done.finish(Err(failed_earlier(&e))),
            }
        }
    }
}

/// The board's view of the operation `fp` (see [`compare_board`]): a failure
/// found there, if any. The store failing only stops the board from being
/// used (`board` becomes `None`, with a warning); the operation carries on.
fn consult_board(
    board: &mut Option<Board>,
    me: Rank,
    fp: &Fingerprint,
    stalled: bool,
    posted: &mut bool,
) -> Option<Error> {
    match compare_board(board.as_mut()?, me, fp, stalled, posted) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("cannot use the store to coordinate failures any more: {e}");
            *board = None;
            None
        }
    }
}

/// Reads failures posted by other ranks and, once the operation `fp` has
/// stalled, posts it (once, `posted`) and compares it with what the other
/// ranks are doing. The outer error is the store failing; the inner one is
/// the failure found.
fn compare_board(
    board: &mut Board,
    me: Rank,
    fp: &Fingerprint,
    stalled: bool,
    posted: &mut bool,
) -> Result<Option<Error>> {
    if let Some(why) = board.failure()? {
        return Ok(Some(Error::Aborted(format!("another rank failed: {why}"))));
    }
    if fp.op == OpKind::SendRecv || !stalled {
        return Ok(None);
    }
    if !*posted {
        board.post_doing(me, fp)?;
        *posted = true;
    }
    let mine = fp.to_string();
    for d in board.others(me)? {
        if d.seq == fp.seq && d.what != mine {
            return Ok(Some(Error::Mismatch {
                me,
                peer: d.rank,
                local: mine,
                remote: format!("is in {}", d.what),
            }));
        }
    }
    Ok(None)
}

/// The error of operations the application aborted.
fn aborted() -> Error {
    Error::Aborted("the communicator was aborted by the application".into())
}

pub(super) fn failed_earlier(e: &Error) -> Error {
    match e {
        Error::Aborted(_) => e.clone(),
        _ => Error::Aborted(format!("the communicator failed earlier: {e}")),
    }
}
