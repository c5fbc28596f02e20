//! Same-host transport over shared memory.
//!
//! Each unordered pair of ranks `{lo, hi}` shares one segment, a file in
//! `/dev/shm` whose name only the job's ranks can derive (see `names.rs`),
//! holding two single-producer single-consumer slot rings (`lo -> hi` and
//! `hi -> lo`, see `ring.rs` and the segment layout in `segment.rs`). The
//! lower rank creates it on `connect`; the higher rank maps it once it
//! exists and removes the name, so nothing is left behind if a process dies
//! later.
//!
//! A send is copied into ring slots, one segment of at most `slot_bytes` per
//! slot, each behind a 64-byte [`FrameHeader`]; the request completes once the
//! last segment is in the ring. Messages to one peer enter its ring in posting
//! order. The receiver looks at the oldest frame of each inbound ring and
//! delivers it to the first posted receive whose [`Tag`] matches; if none does,
//! the frame stays in its slot, where the receive posted next reads it. A
//! fingerprint disagreement is an [`Error::Mismatch`]; anything malformed is an
//! [`Error::Protocol`] naming the peer.
//!
//! Flow control is the receive core's (`recv_core`), with its credits in the
//! ring's counters rather than in frames: a sender may have a ring's worth
//! plus `eager_frames` eager frames unconsumed at the receiver, which keeps
//! that many buffers (made when the pair connects); a message beyond its
//! credits is announced (`Rts`) and sent once its receive is posted (`Cts`).
//! So when a posted receive waits behind frames nobody asked for yet, or one
//! of this rank's sends is stuck on a full ring, the receiver can always take
//! every frame out of the ring: into a buffer, or as an announcement.
//!
//! Large messages skip the slots: a send of at least
//! [`ShmConfig::pull_bytes`] (from a region under
//! [`ShmConfig::pull_region_max`]) is one rendezvous frame, and the receiver copies
//! the bytes straight out of the sender's process (see `pull.rs`) when its
//! receive is posted; the send completes when the receiver reports it
//! pulled. With nothing queued to the peer before it, that frame goes into
//! the ring when the send is posted, not at the next `progress`: it is
//! only an address, and the receiver can copy while the sender's caller
//! goes on (a broadcast's root copies its own output next). A rendezvous
//! frame taken out of the ring early is kept as an announcement, so its
//! message is copied once, to its receive, never into a buffer.
//!
//! Sleeping: a peer's store into shared memory raises no poller event, so each
//! rank has a datagram "doorbell" in the abstract socket namespace. Before the
//! engine sleeps, [`Transport::prepare_sleep`] raises `reader_sleeping` on every
//! inbound ring (and `writer_sleeping` on outbound rings blocked by a full
//! ring), fences, and re-checks; a peer that publishes or frees a slot and sees
//! the flag sends one byte to the doorbell. Without [`Transport::attach`] the
//! transport works by polling alone.

mod cma;
mod costs;
mod doorbell;
mod host_region;
mod names;
pub(crate) mod near;
mod one_sided;
mod private;
mod pull;
mod ring;
mod segment;
mod stream;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_adapt;
#[cfg(test)]
mod tests_in_place;
#[cfg(test)]
mod tests_now;
#[cfg(test)]
mod tests_one_sided;
#[cfg(test)]
mod tests_read;
#[cfg(test)]
mod tests_squat;

use self::cma::Dir;
use self::doorbell::{Doorbell, doorbell_addr};
pub use self::host_region::{HostRegion, process_alive};
use self::pull::RENDEZVOUS_LEN;
use self::ring::{CanPull, Consumer, Corrupt, MAX_PULLS, Producer, next_segment};
pub(crate) use self::segment::pid_alive;
use self::segment::{Layout, Opened, Segment, segment_path};
use crate::error::{Error, Result};
use crate::recv_core::{DEFAULT_EAGER_FRAMES, Posted, Posting, RecvCore};
use crate::regions::{Extent, Regions};
use crate::reqmap::ReqTable;
use crate::seam::{
    Arrival, Landed, MemHandle, MemPtr, Now, Properties, Rank, ReadFrom, Readiness, RemoteRegion,
    Request, SendHint, Tag, Tested, Transport, TransportId, WriteImm,
};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};
use gw_rendezvous::PeerInfo;
use std::collections::VecDeque;
use std::os::unix::net::SocketAddr;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

/// Default payload bytes per ring slot.
pub const DEFAULT_SLOT_BYTES: usize = 512 * 1024;
/// Default slots per ring.
pub const DEFAULT_SLOTS: usize = 8;
/// Default size from which a message is pulled by the receiver in one copy.
pub const DEFAULT_PULL_BYTES: usize = 256 * 1024;
const MAX_SLOT_BYTES: usize = 1 << 30;
const MAX_SLOTS: usize = 1 << 12;
const MAX_JOB_ID: usize = 80;
/// Longest abort reason read from a peer.
const MAX_ABORT_TEXT: usize = 4096;

/// Settings of the shared-memory transport; every rank of a job must use the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Names the job in logs; `[A-Za-z0-9_-]`.
    pub job_id: String,
    /// What the names of segments and doorbells are derived from: 32 to 128
    /// hex digits from a random source (rank 0 draws them and hands them out
    /// through the authenticated store), so that no one outside the job can
    /// know a name before it is used.
    pub name_secret: String,
    /// Payload bytes per slot (default 512 KiB); larger messages are cut.
    pub slot_bytes: usize,
    /// Slots per ring (default 8).
    pub slots: usize,
    /// Messages of at least this many bytes are copied once, by the
    /// receiver, out of the sender's process, where the kernel allows it
    /// (default 256 KiB; 0 never does).
    pub pull_bytes: usize,
    /// Messages sent with [`SendHint::Exchanged`] or [`SendHint::Stored`]
    /// (point-to-point messages, and the collectives' whose receivers only
    /// store them) of at least this many bytes are pulled, out of any
    /// region (default 256 KiB; 0 never). The one copy is then the whole
    /// transfer, so pulling wins from smaller sizes on than for a
    /// collective's segment whose receiver reduces it straight out of its
    /// slot.
    pub p2p_pull_bytes: usize,
    /// Messages sent from a registered region of at least this many bytes
    /// go through the slots however long they are (`usize::MAX`, the
    /// default: no such limit). Such a message is a segment of a large
    /// operation, whose receiver streams it out of its slot into a region
    /// as large, which can beat a pull's cached copy.
    pub pull_region_max: usize,
    /// Frames of each peer buffered ahead of their receives beyond a ring's
    /// worth (`GW_EAGER_FRAMES`): a sender gets `slots + eager_frames`
    /// credits, so a full ring of frames nobody asked for yet can always be
    /// taken out of the ring.
    pub eager_frames: usize,
    /// A collective's segment (a send without a hint), or a stored
    /// message (`SendHint::Stored`) of at least 256 KiB, that the rules
    /// above would pull goes through the slots instead where, as measured
    /// on its ring, the two slot copies cost less than the pull (see `costs.rs`;
    /// default on; the communicator turns it off where ranks share cores
    /// unless `GW_SHM_ADAPT=1` says otherwise). Off, the rules alone
    /// decide, which tests that count pulls rely on.
    pub adaptive: bool,
}

impl ShmConfig {
    /// The default geometry for job `job_id`, whose ranks share `name_secret`.
    pub fn new(job_id: impl Into<String>, name_secret: impl Into<String>) -> ShmConfig {
        ShmConfig {
            job_id: job_id.into(),
            name_secret: name_secret.into(),
            slot_bytes: DEFAULT_SLOT_BYTES,
            slots: DEFAULT_SLOTS,
            pull_bytes: DEFAULT_PULL_BYTES,
            p2p_pull_bytes: DEFAULT_PULL_BYTES,
            pull_region_max: usize::MAX,
            eager_frames: DEFAULT_EAGER_FRAMES,
            adaptive: true,
        }
    }

    /// The credits a sender to this rank gets: eager frames buffered.
    fn credits(&self) -> usize {
        self.slots + self.eager_frames
    }

    fn validate(&self) -> Result<()> {
        let id = &self.job_id;
        if id.is_empty()
            || id.len() > MAX_JOB_ID
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(Error::InvalidArgument(format!(
                "shm job id {id:?} must be 1 to {MAX_JOB_ID} characters of [A-Za-z0-9_-]"
            )));
        }
        names::validate_secret(&self.name_secret)?;
        if !(1..=MAX_SLOT_BYTES).contains(&self.slot_bytes) {
            return Err(Error::InvalidArgument(format!(
                "shm slot size {} must be between 1 and {MAX_SLOT_BYTES} bytes",
                self.slot_bytes
            )));
        }
        if !(1..=MAX_SLOTS).contains(&self.slots) {
            return Err(Error::InvalidArgument(format!(
                "shm slot count {} must be between 1 and {MAX_SLOTS}",
                self.slots
            )));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Region {
    ptr: MemPtr,
    len: usize,
}

impl Extent for Region {
    fn base(&self) -> *mut u8 {
        self.ptr.0
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[derive(Debug)]
struct SendOp {
    req: u64,
    tag: Tag,
    mem: MemHandle,
    /// Start of the message (registered base + offset).
    ptr: MemPtr,
    len: usize,
    /// Bytes already in the ring.
    sent: u64,
    /// Announced, and cleared by the receiver: its frames use no credit.
    cleared: bool,
    /// Credits for all its frames are spent: it goes eagerly.
    reserved: bool,
    /// It is pulled if it has at least this many bytes (`usize::MAX`:
    /// never); see `ShmTransport::post_send`.
    pull_from: usize,
}

/// A message announced to its receiver (an `Rts`), waiting for its `Cts`.
#[derive(Debug)]
struct AnnouncedOut {
    id: u64,
    op: SendOp,
}

/// Where an announced message waits to be pulled from (the payload of its
/// rendezvous frame), and the frame, for messages about it.
#[derive(Clone, Copy, Debug)]
struct PullRef {
    hdr: FrameHeader,
    addr: u64,
    k: u64,
}

/// A send waiting for the receiver to pull it (see `pull.rs`).
#[derive(Debug)]
struct PullOut {
    /// Completion number the receiver reports.
    k: u64,
    req: u64,
    mem: MemHandle,
}

/// What a posted receive keeps besides what matching needs.
#[derive(Debug)]
struct RecvExtra {
    mem: MemHandle,
    /// Lands in a region too large to stay cached: copy around the cache
    /// (see `stream.rs`).
    stream: bool,
    /// Posted with `irecv_in_place`: a message that comes as one frame is
    /// left in its slot for the caller to read (see `Peer::held`).
    in_place: bool,
}

/// A mapped pair segment and our two ring roles in it.
#[derive(Debug)]
struct Conn {
    tx: Producer,
    rx: Consumer,
    /// We checked whether we can pull from the peer's process (see `pull.rs`).
    probed: bool,
    /// Owns the mapping the rings point into (unmapped, and unlinked if still
    /// named, when the connection drops).
    seg: Segment,
}

#[derive(Debug)]
struct Peer {
    info: PeerInfo,
    /// `info.host_id` is this rank's: checked on every transfer, so
    /// compared once here rather than as strings each time.
    same_host: bool,
    bell: SocketAddr,
    conn: Option<Conn>,
    /// `connect` was called: keep trying in `progress`, watch its pid.
    wanted: bool,
    sends: VecDeque<SendOp>,
    /// Our messages announced to the peer, waiting for its `Cts`.
    announced: VecDeque<AnnouncedOut>,
    next_announce: u64,
    /// Eager frames sent to the peer so far (its ring's `consumed` counts
    /// those it has consumed; the difference is what our credits cover).
    sent_eager: u64,
    /// Control frames (`Cts`, `Imm`) waiting for room in the peer's ring.
    ctl: VecDeque<[u8; HEADER_LEN]>,
    /// Control frames pushed into the ring so far (those queued are these
    /// and `ctl`).
    ctl_pushed: u64,
    /// One-sided writes whose `Imm` frame is queued: (its number among
    /// the control frames, the request). A write is complete only once
    /// its frame is in the ring: a writer that then goes idle or leaves
    /// must not strand the peer's immediate in this queue.
    imm_reqs: VecDeque<(u64, u64)>,
    /// What arrives from the peer: posted receives, early frames,
    /// announcements (`Rts`, and rendezvous frames taken out of the ring).
    core: RecvCore<RecvExtra, Option<PullRef>>,
    /// Eager frames of the peer consumed so far, as published in its ring.
    consumed: u64,
    /// The receive whose message is partly delivered: its next segment must come next.
    active: Option<u64>,
    /// The peer sent a Close frame: it shut its side down cleanly.
    closed: bool,
    /// Our rendezvous sends not yet pulled, oldest first.
    pulls_out: VecDeque<PullOut>,
    /// Completion number of our next rendezvous send.
    next_pull: u64,
    /// A receive completed in place: the oldest frame of the inbound ring
    /// is its message, read by the caller where it lies, and nothing behind
    /// it is delivered until `release_in_place` frees the slot.
    /// (request, message length)
    held: Option<(u64, usize)>,
    /// Immediates of the peer's one-sided writes into our regions, not yet
    /// taken (see `one_sided.rs`).
    imms: VecDeque<u32>,
    /// `next_imm` found none: take frames out of the ring until one comes,
    /// even when no receive is posted (an immediate may wait behind data).
    wants_imm: bool,
    /// Pull or slots for our large messages, by what they cost.
    choice: costs::PathChoice,
}

impl Peer {
    /// Queues control frame `h`; returns its number among the control
    /// frames (pushed ones first).
    fn queue_ctl(&mut self, h: [u8; HEADER_LEN]) -> u64 {
        self.ctl.push_back(h);
        self.ctl_pushed + self.ctl.len() as u64 - 1
    }

    fn who(&self) -> String {
        format!("rank {} ({})", self.info.rank, self.info.hostname)
    }

    fn corrupt(&self, c: Corrupt) -> Error {
        Error::Protocol(format!("shared memory from {}: {}", self.who(), c.0))
    }

    /// Whether frames of this peer nobody has asked for yet are taken out
    /// of its ring now (into the receive core's buffers, or as
    /// announcements) rather than left in their slots for the receive
    /// posted next to copy once. `eager`: one of this rank's sends is stuck
    /// on a full ring, so a cycle of full rings could form through other
    /// ranks. Otherwise a frame behind them is awaited: an immediate
    /// (`wants_imm`), a posted receive's message, or the clearance (`Cts`)
    /// of a message of ours announced to this peer, which comes behind
    /// whatever the peer sent before it. Left in the ring, that frame would
    /// hold the clearance back while our caller waits for the send before
    /// it posts the receive that takes the frame (an rd all-reduce on four
    /// ranks hung so, each partner waiting for the other).
    fn drains_early(&self, eager: bool) -> bool {
        eager || self.wants_imm || !self.core.posted().is_empty() || !self.announced.is_empty()
    }

    fn has_ops(&self) -> bool {
        !self.sends.is_empty()
            || !self.core.posted().is_empty()
            || !self.pulls_out.is_empty()
            || !self.announced.is_empty()
    }

    /// Eager frames we may still send the peer: its credits less those sent
    /// and not yet consumed. At least `need` whenever that many are left;
    /// the consumer's count is read afresh only when the one seen last
    /// leaves fewer (see `Producer::consumed`).
    fn credits(&self, need: usize) -> usize {
        let Some(conn) = &self.conn else {
            return 0;
        };
        eager_credits(&conn.tx, self.sent_eager, need)
    }

    /// Whether a message of `len` bytes would go through slots of
    /// `slot_bytes` at once: nothing announced and waiting, and credits for
    /// its frames and for every frame queued before it. Beyond its credits
    /// a message through the slots is announced and waits for its receive
    /// (three trips through the rings), which a pull never does, so the
    /// costs of the copies alone (`costs.rs`) decide only where this holds.
    fn slots_free_for(&self, len: usize, slot_bytes: usize) -> bool {
        let frames = |n: usize| n.div_ceil(slot_bytes).max(1);
        let queued: usize = self
            .sends
            .iter()
            .filter(|op| !op.reserved && op.len < op.pull_from)
            .map(|op| frames(op.len))
            .sum();
        self.announced.is_empty() && queued + frames(len) <= self.credits(queued + frames(len))
    }

    /// Credits the eager frames consumed since last said, through the ring.
    fn publish_consumed(&mut self) {
        let n = self.core.take_owed(1);
        if n > 0 {
            self.consumed = self.consumed.wrapping_add(u64::from(n));
            if let Some(conn) = &self.conn {
                conn.rx.set_consumed(self.consumed);
            }
        }
    }

    fn closed_error(&self, what: &str) -> Error {
        Error::Remote {
            rank: self.info.rank,
            addr: self.info.hostname.clone(),
            what: what.into(),
        }
    }
}

/// What to do with the oldest frame of an inbound ring.
enum Head {
    /// Copy it (or, for a rendezvous frame, the message it names) into
    /// posted receive number `.0`.
    Deliver(usize, FrameHeader),
    /// No posted receive wants it yet: buffer it (see `recv_core`).
    Early(FrameHeader),
    /// A message announced (`Rts`): its sender waits to be told to send it.
    Announce(FrameHeader),
    /// One of our announced messages may go now (`Cts`).
    Cleared(FrameHeader),
    /// The peer shut down cleanly; nothing follows.
    Close,
    /// A one-sided write of the peer's landed; its immediate.
    Imm(u64),
}

/// The same-host shared-memory transport (see the module documentation).
#[derive(Debug)]
pub struct ShmTransport {
    /// Issues this transport's memory handles and requests.
    id: TransportId,
    me: Rank,
    cfg: ShmConfig,
    layout: Layout,
    peers: Vec<Peer>,
    regions: Regions<Region>,
    /// Outstanding and completed-but-untested requests: `true` once complete.
    reqs: ReqTable<bool>,
    next_req: u64,
    bell: Doorbell,
    token: Option<mio::Token>,
    /// Set by `abort`: registered memory is never touched again.
    aborted: bool,
    /// Where `next_imm` looks first (see there).
    imm_cursor: usize,
    /// The sleep flags in the rings are raised (`prepare_sleep`): clearing
    /// them is a store to a line the peer reads, so only done when needed.
    armed: bool,
}

impl ShmTransport {
    /// me: this rank; peers: every rank's PeerInfo (index = rank) — use pid for liveness and hostname for messages.
    pub fn new(me: u32, peers: Vec<PeerInfo>, cfg: ShmConfig) -> Result<ShmTransport> {
        cfg.validate()?;
        if me as usize >= peers.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {me} is outside a world of {} ranks",
                peers.len()
            )));
        }
        let my_host = peers[me as usize].host_id.clone();
        let mut ps = Vec::with_capacity(peers.len());
        for (i, info) in peers.into_iter().enumerate() {
            if info.rank as usize != i {
                return Err(Error::InvalidArgument(format!(
                    "peer record {i} is for rank {}: records must be indexed by rank",
                    info.rank
                )));
            }
            let rank = info.rank;
            ps.push(Peer {
                bell: doorbell_addr(&cfg.name_secret, info.rank)?,
                same_host: info.host_id == my_host,
                info,
                conn: None,
                wanted: false,
                // Reserved like the request table (a few KiB per peer), so a
                // new high of posted operations does not allocate mid-run.
                sends: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
                announced: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
                next_announce: 0,
                sent_eager: 0,
                ctl: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
                ctl_pushed: 0,
                imm_reqs: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
                // Its buffers are made when the connection is.
                core: RecvCore::unconnected(me, rank, cfg.slot_bytes),
                consumed: 0,
                active: None,
                closed: false,
                pulls_out: VecDeque::with_capacity(MAX_PULLS as usize),
                next_pull: 0,
                held: None,
                imms: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
                wants_imm: false,
                choice: costs::PathChoice::default(),
            });
        }
        if cfg.pull_bytes > 0 || cfg.p2p_pull_bytes > 0 {
            pull::allow_peers_to_pull();
        }
        tracing::info!(
            "shm: rank {me}, job {}, {} slots of {} bytes per ring, single copy from {} bytes{}, \
             point-to-point and stored messages from {} bytes",
            cfg.job_id,
            cfg.slots,
            cfg.slot_bytes,
            cfg.pull_bytes,
            if cfg.pull_region_max == usize::MAX {
                String::new()
            } else {
                format!(" out of regions under {} bytes", cfg.pull_region_max)
            },
            cfg.p2p_pull_bytes
        );
        Ok(ShmTransport {
            id: TransportId::next(),
            me,
            layout: Layout {
                slots: cfg.slots,
                slot_bytes: cfg.slot_bytes,
            },
            cfg,
            peers: ps,
            regions: Regions::new(),
            // Reserved: a table that grows when more requests than ever are
            // live at once would allocate in a steady-state step (hashbrown
            // rehashes in place while at most half full).
            reqs: ReqTable::with_capacity(crate::seam::REQS_RESERVED),
            next_req: 1,
            bell: Doorbell::new()?,
            token: None,
            aborted: false,
            imm_cursor: 0,
            armed: false,
        })
    }

    /// Frames of peers held in early buffers now, and the buffers there are
    /// (a ring's worth plus `eager_frames` per connected peer).
    pub fn early_buffered(&self) -> (usize, usize) {
        self.peers.iter().fold((0, 0), |(n, cap), p| {
            (n + p.core.buffered(), cap + p.core.buffers())
        })
    }

    /// Checks that `peer` is a rank this transport can reach.
    fn check_peer(&self, peer: Rank) -> Result<()> {
        let Some(p) = self.peers.get(peer as usize) else {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} is outside a world of {} ranks",
                self.peers.len()
            )));
        };
        if peer == self.me {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} cannot use shared memory with itself"
            )));
        }
        if !p.same_host {
            let mine = &self.peers[self.me as usize].info;
            return Err(Error::InvalidArgument(format!(
                "{} is on another host than this rank ({}): shared memory needs the same host",
                p.who(),
                mine.hostname
            )));
        }
        Ok(())
    }

    /// Checks that this transport is not aborted and `peer` is a valid
    /// shared-memory peer (it may have closed: what it sent before can
    /// still be received).
    fn check_live(&self, peer: Rank) -> Result<()> {
        if self.aborted {
            return Err(Error::Aborted("the shm transport was aborted".into()));
        }
        self.check_peer(peer)
    }

    /// Checks that a transfer with `peer` may be posted now.
    fn check_post(&self, peer: Rank) -> Result<()> {
        self.check_live(peer)?;
        let p = &self.peers[peer as usize];
        if p.closed {
            return Err(p.closed_error(
                "has shut its communicator down; nothing more can be exchanged with it",
            ));
        }
        Ok(())
    }

    /// Writes a frame without an operation (abort reason, close notice) to
    /// every connected peer whose ring has a free slot; never blocks.
    fn push_control(&mut self, kind: FrameKind, reason: &str) {
        let me = self.me;
        for p in &mut self.peers {
            let Some(conn) = p.conn.as_mut() else {
                continue;
            };
            if p.closed || conn.tx.free().unwrap_or(0) == 0 {
                continue;
            }
            let mut end = reason.len().min(conn.tx.slot_bytes());
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            let text = &reason.as_bytes()[..end];
            let header = FrameHeader::control(kind, me, text.len()).encode();
            if conn.tx.push(&header, text).unwrap_or(false) && conn.tx.take_reader_sleeping() {
                self.bell.ring(&p.bell);
            }
        }
    }

    /// The error to report for a one-sided write into (or read from)
    /// `peer` that failed with `e`. A peer whose region vanished (EFAULT) or whose process is
    /// gone (ESRCH) has usually failed first and said why in an Abort frame:
    /// it pushes that frame before handing its buffers back, but our write
    /// does not pass through its ring, so the frame may still wait there.
    /// Its reason (naming the rank that really failed) beats our symptom.
    fn write_failed(&mut self, peer: Rank, e: Error) -> Error {
        let errno = match &e {
            Error::Sys { source, .. } => source.raw_os_error(),
            _ => None,
        };
        if !matches!(errno, Some(libc::EFAULT) | Some(libc::ESRCH)) {
            return e;
        }
        let me = self.me;
        let p = &mut self.peers[peer as usize];
        loop {
            match pump_recvs(me, true, p, &mut self.bell, &mut self.reqs) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(abort @ Error::Remote { .. }) => return abort,
                Err(_) => break,
            }
        }
        if errno == Some(libc::ESRCH) {
            return Error::Remote {
                rank: p.info.rank,
                addr: p.info.hostname.clone(),
                what: format!("process {} died", p.info.pid),
            };
        }
        e
    }

    /// The registered range `[offset, offset + len)` of `mem`, and the length
    /// of the whole registered region.
    fn range(
        &self,
        mem: MemHandle,
        offset: usize,
        len: usize,
        what: &str,
    ) -> Result<(MemPtr, usize)> {
        let index = mem.index_for(self.id, "shm")?;
        let (at, r) = self.regions.range(index, offset, len, what)?;
        Ok((MemPtr(at), r.len))
    }

    /// Posts a send (see `isend` and `isend_hinted`); whether the receiver
    /// may pull it, where it is long enough, depends on `hint`.
    fn post_send(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
        hint: Option<SendHint>,
    ) -> Result<Request> {
        self.check_post(peer)?;
        let (ptr, region_len) = self.range(mem, offset, len, "isend")?;
        let req = self.new_req();
        let mut pull_from = self.pull_from(hint, region_len);
        let me = self.me;
        let p = &mut self.peers[peer as usize];
        // A collective's own segments (no hint) are chosen by cost where
        // their credits let them go at once: beyond them a segment through
        // the slots is announced and waits for its receive, three trips
        // through the rings that a pull never takes, which a window of 64
        // KiB exchanges lost 0.71x to. A stored message (`Stored`: a
        // point-to-point message with a core per rank) is chosen by cost
        // from `STORED_CHOICE_BYTES` whatever its credits: its receiver
        // only stores it, and where the slots copy fast a one-way stream
        // of such messages ran 2.4-3x faster through them, announced or
        // not; below, one frame's two copies run one after the other, and
        // a 64 KiB ping-pong chosen so lost 0.92x even where
        // larger messages gained. An exchange (`Exchanged`) keeps its
        // pull: it may come out of a region of any size, where two slot
        // copies that each ran in cache lost to one pull (docs/
        // performance.md, "Pull or slots, measured").
        let by_cost = match hint {
            None => true,
            Some(SendHint::Stored) => len >= costs::STORED_CHOICE_BYTES,
            Some(SendHint::Exchanged | SendHint::Pushed) => false,
        };
        if self.cfg.adaptive
            && by_cost
            && len >= pull_from
            && let Some(conn) = p.conn.as_ref()
            && conn.tx.can_pull() == CanPull::Yes
            && (hint.is_some() || p.slots_free_for(len, conn.tx.slot_bytes()))
            && !p
                .choice
                .pull(conn.tx.costs(), len.min(conn.tx.slot_bytes()))
        {
            pull_from = usize::MAX;
        }
        p.sends.push_back(SendOp {
            req,
            tag,
            mem,
            ptr,
            len,
            sent: 0,
            cleared: false,
            reserved: false,
            pull_from,
        });
        let pulled = p
            .conn
            .as_ref()
            .is_some_and(|c| c.tx.can_pull() == CanPull::Yes);
        if pulled && len >= pull_from && p.sends.len() == 1 {
            // Nothing queued before it, and its frame is only the address
            // to pull from: out now, so that the receiver copies while the
            // caller goes on (a broadcast's root copies its own output
            // next, which otherwise ran before the receiver could start).
            // A peer that cannot pull gets the bytes through the slots, at
            // the next progress as before.
            pump_sends(me, p, &mut self.bell, &mut self.reqs)?;
        }
        Ok(Request::new(self.id, req))
    }

    /// The size from which a send posted with `hint` out of a registered
    /// region of `region_len` bytes is pulled (`usize::MAX`: never).
    fn pull_from(&self, hint: Option<SendHint>, region_len: usize) -> usize {
        let from = match hint {
            Some(SendHint::Pushed) => 0,
            None if region_len >= self.cfg.pull_region_max => 0,
            None => self.cfg.pull_bytes,
            Some(SendHint::Exchanged | SendHint::Stored) => self.cfg.p2p_pull_bytes,
        };
        match from {
            0 => usize::MAX,
            // A rendezvous frame's payload must fit its slot, and a frame's
            // payload never exceeds its message.
            _ if self.cfg.slot_bytes < RENDEZVOUS_LEN => usize::MAX,
            n => n.max(RENDEZVOUS_LEN),
        }
    }

    /// Posts a receive (see `irecv` and `irecv_in_place`).
    fn post_recv(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
        in_place: bool,
    ) -> Result<Request> {
        self.check_live(peer)?;
        let (ptr, region_len) = self.range(mem, offset, len, "irecv")?;
        let stream = region_len >= stream::STREAM_REGION_BYTES;
        let req = self.new_req();
        let me = self.me;
        let p = &mut self.peers[peer as usize];
        let extra = RecvExtra {
            mem,
            stream,
            in_place,
        };
        let posted = Posted::new(req, tag, ptr, len, extra);
        // SAFETY: ptr is valid for len bytes (checked against the
        // registration, which stays while the receive is posted).
        let posting = unsafe { p.core.post(posted)? };
        p.publish_consumed();
        match posting {
            Posting::Done => {
                self.reqs.finish(req, true);
                return Ok(Request::new(self.id, req));
            }
            Posting::Pending => {}
            Posting::Clear { a: Some(pull), .. } => {
                // A message left in the sender's memory: copy it now.
                // SAFETY: as above.
                unsafe { pull_bytes(p, &pull.hdr, pull.addr, ptr.0, len)? };
                if let Some(conn) = p.conn.as_ref() {
                    conn.rx.mark_pulled(pull.k);
                    // A sender waiting only for this pull may be asleep
                    // (see `set_sleep_flags`): nothing else would wake it.
                    if conn.rx.take_writer_sleeping() {
                        self.bell.ring(&p.bell);
                    }
                }
                if let Some(i) = p.core.index_of(req) {
                    p.core.take(i);
                }
                self.reqs.finish(req, true);
                return Ok(Request::new(self.id, req));
            }
            Posting::Clear { id, a: None } => {
                let cts = FrameHeader {
                    offset: id,
                    ..FrameHeader::control(FrameKind::Cts, me, 0)
                };
                p.queue_ctl(cts.encode());
            }
        }
        if p.closed {
            // Frames sent before the close were buffered; nothing more comes.
            if let Some(i) = p.core.index_of(req) {
                p.core.take(i);
            }
            self.reqs.remove(&req);
            return Err(p.closed_error(
                "has shut its communicator down; nothing more can be exchanged with it",
            ));
        }
        if p.core.posted().iter().any(|r| r.req == req && r.got > 0) {
            // The rest of this message is next in the ring.
            p.active = Some(req);
        }
        Ok(Request::new(self.id, req))
    }

    /// The peer whose inbound ring holds request `req`'s message in place,
    /// and the message's length.
    fn holder(&self, req: u64) -> Option<(usize, usize)> {
        self.peers
            .iter()
            .enumerate()
            .find_map(|(i, p)| match p.held {
                Some((r, len)) if r == req => Some((i, len)),
                _ => None,
            })
    }

    fn new_req(&mut self) -> u64 {
        let id = self.next_req;
        self.next_req += 1;
        self.reqs.post(id, false);
        id
    }

    /// Whether `progress` would do something now (or must report an error).
    fn has_work(&self) -> bool {
        let eager = self.any_send_stuck();
        !self.aborted
            && (0..self.peers.len()).any(|i| i != self.me as usize && self.peer_has_work(i, eager))
    }

    /// Whether early frames must be taken out of the rings now (see
    /// `pump_recvs`): a send of ours waits for ring space.
    fn any_send_stuck(&self) -> bool {
        self.peers
            .iter()
            .any(|p| !p.sends.is_empty() || !p.ctl.is_empty())
    }

    fn peer_has_work(&self, i: usize, eager: bool) -> bool {
        let p = &self.peers[i];
        let Some(conn) = &p.conn else {
            if !p.wanted && !p.has_ops() {
                return false;
            }
            // The lower rank creates at once; the higher one waits for the file.
            return self.me < p.info.rank
                || segment_path(&self.cfg.name_secret, p.info.rank, self.me).exists();
        };
        if p.closed {
            // Nothing follows a close; queued sends are an error progress reports.
            return !p.sends.is_empty();
        }
        if (!p.sends.is_empty() || !p.ctl.is_empty()) && !matches!(conn.tx.free(), Ok(0)) {
            return true;
        }
        if p.pulls_out.iter().any(|o| conn.tx.pulled(o.k)) {
            return true;
        }
        if !conn.probed && conn.rx.probe_addr() != 0 {
            return true;
        }
        if p.held.is_some() {
            // The oldest inbound frame is delivered already, read in place.
            return false;
        }
        // An inbound frame is work when it is delivered or buffered now
        // (`drains_early`), or it is neither data nor rendezvous (an
        // announcement, a clearance, close, abort, or garbage to report).
        match conn.rx.peek() {
            Ok(None) => false,
            Ok(Some(raw)) => {
                p.drains_early(eager)
                    || !matches!(FrameHeader::decode(&raw),
                        Ok(h) if matches!(h.kind, FrameKind::Data | FrameKind::Rendezvous))
            }
            Err(_) => true,
        }
    }

    fn set_sleep_flags(&self, on: bool) {
        for p in &self.peers {
            if let Some(conn) = &p.conn {
                conn.rx.set_reader_sleeping(on);
                let blocked = ((!p.sends.is_empty() || !p.ctl.is_empty())
                    && matches!(conn.tx.free(), Ok(0)))
                    || !p.pulls_out.is_empty();
                conn.tx.set_writer_sleeping(on && blocked);
            }
        }
    }
}

/// Finds out, once the peer published its probe word, whether we can pull
/// from its process, and tells it through the ring.
fn probe_peer(p: &mut Peer) {
    let Some(conn) = p.conn.as_mut() else {
        return;
    };
    if conn.probed {
        return;
    }
    let addr = conn.rx.probe_addr();
    if addr == 0 {
        return;
    }
    let yes = pull::probe(p.info.pid, addr);
    conn.rx.set_can_pull(yes);
    conn.probed = true;
    if yes {
        tracing::info!(
            "shm: large messages from {} are pulled in one copy",
            p.who()
        );
    } else {
        tracing::info!(
            "shm: process_vm_readv of {} refused; its large messages go through the slots",
            p.who()
        );
    }
}

/// Decides what to do with the oldest frame `raw` of peer `p`'s inbound ring.
fn examine(p: &Peer, rx: &Consumer, raw: &[u8; HEADER_LEN]) -> Result<Head> {
    let h = FrameHeader::decode(raw).map_err(|e| match e {
        Error::Protocol(m) => Error::Protocol(format!("shared memory from {}: {m}", p.who())),
        other => other,
    })?;
    let slot_bytes = rx.slot_bytes();
    if h.len > slot_bytes as u64 {
        return Err(Error::Protocol(format!(
            "shared memory from {}: a {}-byte segment in a {slot_bytes}-byte slot",
            p.who(),
            h.len
        )));
    }
    if h.kind == FrameKind::Close {
        return Ok(Head::Close);
    }
    if h.kind == FrameKind::Rendezvous && (h.len != RENDEZVOUS_LEN as u64 || p.active.is_some()) {
        return Err(Error::Protocol(format!(
            "shared memory from {}: a rendezvous frame of {} bytes{}",
            p.who(),
            h.len,
            if p.active.is_some() {
                " in the middle of a message"
            } else {
                ""
            }
        )));
    }
    if h.kind == FrameKind::Abort {
        let mut text = vec![0u8; (h.len as usize).min(MAX_ABORT_TEXT)];
        rx.read_payload(&mut text).map_err(|c| p.corrupt(c))?;
        return Err(Error::Remote {
            rank: p.info.rank,
            addr: p.info.hostname.clone(),
            what: format!("aborted: {}", String::from_utf8_lossy(&text)),
        });
    }
    if h.src_rank != p.info.rank {
        return Err(Error::Protocol(format!(
            "shared memory from {}: frame claims to come from rank {}",
            p.who(),
            h.src_rank
        )));
    }
    match h.kind {
        FrameKind::Rts => return Ok(Head::Announce(h)),
        FrameKind::Cts => return Ok(Head::Cleared(h)),
        FrameKind::Imm => return Ok(Head::Imm(h.offset)),
        FrameKind::Credit => {
            return Err(Error::Protocol(format!(
                "shared memory from {}: a credit frame (credits travel in the ring's counters)",
                p.who()
            )));
        }
        FrameKind::Grant | FrameKind::Put | FrameKind::Get | FrameKind::Fetched => {
            return Err(Error::Protocol(format!(
                "shared memory from {}: a {:?} frame, which only RDMA and TCP transports send",
                p.who(),
                h.kind
            )));
        }
        _ => {}
    }
    if let Some(active) = p.active {
        let i = p
            .core
            .index_of(active)
            .ok_or_else(|| Error::Internal(format!("active receive {active} is not posted")))?;
        let r = &p.core.posted()[i];
        if h.tag != r.tag || h.total != r.len as u64 || h.offset != r.got as u64 {
            return Err(Error::Protocol(format!(
                "{} sent bytes [{}, +{}) of {} step {} ({} bytes) while bytes from {} of {} step {} ({} bytes) were due",
                p.who(),
                h.offset,
                h.len,
                h.tag.described_like(&r.tag),
                h.tag.step,
                h.total,
                r.got,
                r.tag,
                r.tag.step,
                r.len
            )));
        }
        return Ok(Head::Deliver(i, h));
    }
    if let Some(i) = p.core.find(&h)? {
        let r = &p.core.posted()[i];
        if h.offset != 0 {
            return Err(Error::Protocol(format!(
                "{} started {} step {} at byte {} instead of 0",
                p.who(),
                h.tag.described_like(&r.tag),
                h.tag.step,
                h.offset
            )));
        }
        return Ok(Head::Deliver(i, h));
    }
    Ok(Head::Early(h))
}

/// Eager frames the ring's consumer will still take from us, with
/// `sent` sent so far: at least `need` whenever that many are left.
fn eager_credits(tx: &Producer, sent: u64, need: usize) -> usize {
    let left = |consumed: u64| {
        let out = sent.wrapping_sub(consumed);
        (tx.credits() as u64).saturating_sub(out) as usize
    };
    match left(tx.consumed(false)) {
        n if n >= need => n,
        _ => left(tx.consumed(true)),
    }
}

/// Copies as many queued segments to `p` as its ring has free slots; a
/// message of at least its `pull_from` bytes goes as one rendezvous frame
/// instead when the peer can pull from us. Control frames go first. A message goes
/// eagerly only if the peer has a credit for each of its frames; otherwise
/// it is announced and waits for the peer's `Cts` (see `recv_core`).
fn pump_sends(
    me: Rank,
    p: &mut Peer,
    bell: &mut Doorbell,
    reqs: &mut ReqTable<bool>,
) -> Result<bool> {
    let credits = p.credits(1);
    let Some(conn) = p.conn.as_mut() else {
        return Ok(false);
    };
    let slot_bytes = conn.tx.slot_bytes();
    let mut pushed = false;
    while let Some(h) = p.ctl.front() {
        if !push_frame(&mut conn.tx, p.info.rank, h, &[])? {
            break;
        }
        p.ctl.pop_front();
        p.ctl_pushed += 1;
        pushed = true;
    }
    while let Some(&(k, req)) = p.imm_reqs.front() {
        if k >= p.ctl_pushed {
            break;
        }
        p.imm_reqs.pop_front();
        reqs.finish(req, true);
    }
    let mut credits = credits;
    while let Some(op) = p.sends.front_mut() {
        if op.sent == 0
            && !op.cleared
            && op.len >= op.pull_from
            && conn.tx.can_pull() == CanPull::Yes
        {
            if p.pulls_out.len() as u64 >= MAX_PULLS {
                break;
            }
            let k = p.next_pull;
            let header = FrameHeader {
                kind: FrameKind::Rendezvous,
                cleared: false,
                credits: 0,
                src_rank: me,
                tag: op.tag,
                offset: 0,
                len: RENDEZVOUS_LEN as u64,
                total: op.len as u64,
            }
            .encode();
            let payload = pull::encode(op.ptr.0 as u64, k);
            if !push_frame(&mut conn.tx, p.info.rank, &header, &payload)? {
                break;
            }
            pushed = true;
            p.next_pull = k.wrapping_add(1);
            p.pulls_out.push_back(PullOut {
                k,
                req: op.req,
                mem: op.mem,
            });
            p.sends.pop_front();
            continue;
        }
        if !op.reserved && !op.cleared {
            let frames = (op.len.div_ceil(slot_bytes)).max(1);
            if frames > credits {
                credits = eager_credits(&conn.tx, p.sent_eager, frames);
            }
            if frames <= credits {
                // Spent now for the whole message: its frames may take
                // several calls to fit the ring.
                credits -= frames;
                p.sent_eager = p.sent_eager.wrapping_add(frames as u64);
                op.reserved = true;
            } else {
                let id = p.next_announce;
                let rts = FrameHeader {
                    tag: op.tag,
                    offset: id,
                    total: op.len as u64,
                    ..FrameHeader::control(FrameKind::Rts, me, 0)
                }
                .encode();
                if !push_frame(&mut conn.tx, p.info.rank, &rts, &[])? {
                    break;
                }
                pushed = true;
                p.next_announce += 1;
                if let Some(op) = p.sends.pop_front() {
                    p.announced.push_back(AnnouncedOut { id, op });
                }
                continue;
            }
        }
        let (offset, len) = next_segment(op.sent, op.len as u64, slot_bytes);
        let header = FrameHeader {
            kind: FrameKind::Data,
            cleared: op.cleared,
            credits: 0,
            src_rank: me,
            tag: op.tag,
            offset,
            len,
            total: op.len as u64,
        }
        .encode();
        let payload: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: [offset, offset+len) lies within the op's len bytes, which were
            // bounds-checked against a live registration at isend time (deregister
            // refuses while the op is queued); the caller promised the memory is not
            // written concurrently while the send is posted.
            unsafe { std::slice::from_raw_parts(op.ptr.0.add(offset as usize), len as usize) }
        };
        if !push_frame(&mut conn.tx, p.info.rank, &header, payload)? {
            break;
        }
        pushed = true;
        op.sent += len;
        if op.sent == op.len as u64 {
            reqs.finish(op.req, true);
            p.sends.pop_front();
        }
    }
    if pushed && conn.tx.take_reader_sleeping() {
        bell.ring(&p.bell);
    }
    Ok(pushed)
}

/// Frees the oldest inbound frame's slot, waking the peer if it waits for
/// room.
fn free_head(conn: &mut Conn, bell: &mut Doorbell, peer_bell: &SocketAddr) {
    conn.rx.pop();
    if conn.rx.take_writer_sleeping() {
        bell.ring(peer_bell);
    }
}

/// Writes one frame into the ring to `rank`; `false` if the ring is full.
fn push_frame(
    tx: &mut Producer,
    rank: Rank,
    header: &[u8; HEADER_LEN],
    payload: &[u8],
) -> Result<bool> {
    tx.push(header, payload)
        .map_err(|c| Error::Protocol(format!("shared memory to {rank}: {}", c.0)))
}

/// Completes our rendezvous sends to `p` that the peer has pulled.
fn reap_pulls(p: &mut Peer, reqs: &mut ReqTable<bool>) -> bool {
    let Some(conn) = p.conn.as_ref() else {
        return false;
    };
    if p.pulls_out.is_empty() {
        return false;
    }
    let before = p.pulls_out.len();
    p.pulls_out.retain(|o| {
        let done = conn.tx.pulled(o.k);
        if done {
            reqs.finish(o.req, true);
        }
        !done
    });
    p.pulls_out.len() != before
}

/// The (address, completion number) of the rendezvous frame at the head of
/// `p`'s inbound ring.
fn rendezvous_at_head(p: &Peer) -> Result<(u64, u64)> {
    let conn = p
        .conn
        .as_ref()
        .ok_or_else(|| Error::Internal("connection vanished".into()))?;
    let mut raw = [0u8; RENDEZVOUS_LEN];
    conn.rx.read_payload(&mut raw).map_err(|c| p.corrupt(c))?;
    Ok(pull::decode(&raw))
}

/// Copies `len` bytes at `addr` in `p`'s process (part of the message `h`
/// names) to `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
unsafe fn pull_bytes(p: &Peer, h: &FrameHeader, addr: u64, dst: *mut u8, len: usize) -> Result<()> {
    let pid = p.info.pid;
    let timed = costs::timer(len);
    // SAFETY: the caller's promise on dst.
    match unsafe { pull::pull(pid, addr, dst, len) } {
        Ok(()) => {
            if let (Some(t), Some(conn)) = (timed, p.conn.as_ref()) {
                conn.rx.record_pull(t.elapsed(), len);
            }
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(Error::Remote {
            rank: p.info.rank,
            addr: p.info.hostname.clone(),
            what: format!("process {pid} died"),
        }),
        Err(e) => Err(Error::sys(
            "process_vm_readv",
            format!(
                "pulling {len} bytes of {} step {} at {addr:#x} from {}",
                h.tag,
                h.tag.step,
                p.who()
            ),
            e,
        )),
    }
}

/// Frees the rendezvous frame's slot and tells the sender message `k` is
/// pulled.
fn retire_rendezvous(p: &mut Peer, k: u64) -> Result<()> {
    let conn = p
        .conn
        .as_mut()
        .ok_or_else(|| Error::Internal("connection vanished".into()))?;
    conn.rx.pop();
    conn.rx.mark_pulled(k);
    Ok(())
}

/// Copies the message a rendezvous frame names out of `p`'s process into
/// `dst` (`len` bytes), then reports it pulled and frees the frame's slot.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
unsafe fn pull_message(p: &mut Peer, h: &FrameHeader, dst: *mut u8, len: usize) -> Result<()> {
    let (addr, k) = rendezvous_at_head(p)?;
    // SAFETY: the caller's promise on dst.
    unsafe { pull_bytes(p, h, addr, dst, len)? };
    retire_rendezvous(p, k)
}

/// Delivers the frames at the head of `p`'s inbound ring to matching receives.
///
/// Frames nobody has asked for yet are taken out of the ring only when
/// [`Peer::drains_early`] says so: eager data into the receive core's
/// buffers (the sender's credits guarantee room), rendezvous frames as
/// announcements (their message stays in the sender's memory until its
/// receive is posted). Announcements and clearances are always taken at
/// once.
fn pump_recvs(
    me: Rank,
    eager: bool,
    p: &mut Peer,
    bell: &mut Doorbell,
    reqs: &mut ReqTable<bool>,
) -> Result<bool> {
    if p.held.is_some() {
        return Ok(false);
    }
    let (mut popped, mut held) = (false, false);
    loop {
        let Some(conn) = p.conn.as_ref() else {
            return Ok(false);
        };
        let Some(raw) = conn.rx.peek().map_err(|c| p.corrupt(c))? else {
            break;
        };
        let (i, h) = match examine(p, &conn.rx, &raw)? {
            Head::Early(_) if !p.drains_early(eager) => {
                // Nothing here waits for a frame behind this one and none of
                // our sends is stuck, so no rank can be waiting on us to make
                // room: leave it in the ring, and the receive that is posted
                // next takes it straight from the slot (one copy, not three).
                break;
            }
            Head::Early(h) if h.kind == FrameKind::Rendezvous => {
                let (addr, k) = rendezvous_at_head(p)?;
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                popped = true;
                // Not posted (examine looked), so it waits in the core.
                if let Some((i, _, _)) = p.core.announce(h, Some(PullRef { hdr: h, addr, k }))? {
                    return Err(Error::Internal(format!(
                        "rendezvous frame of {} matched receive {i} only after examine",
                        h.tag
                    )));
                }
                continue;
            }
            Head::Early(h) => {
                let conn = p
                    .conn
                    .as_ref()
                    .ok_or_else(|| Error::Internal("connection vanished".into()))?;
                let (b, buf) = p.core.early_buffer(&h)?;
                conn.rx.read_payload(buf).map_err(|c| {
                    Error::Protocol(format!("shared memory from rank {}: {}", p.info.rank, c.0))
                })?;
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                if let Some(r) = p.core.file(h, b)? {
                    reqs.finish(r.req, true);
                }
                popped = true;
                continue;
            }
            Head::Announce(h) => {
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                popped = true;
                if let Some((_, id, _)) = p.core.announce(h, None)? {
                    let cts = FrameHeader {
                        offset: id,
                        ..FrameHeader::control(FrameKind::Cts, me, 0)
                    };
                    p.queue_ctl(cts.encode());
                }
                continue;
            }
            Head::Cleared(h) => {
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                popped = true;
                let Some(k) = p.announced.iter().position(|a| a.id == h.offset) else {
                    return Err(Error::Protocol(format!(
                        "shared memory from {}: clearance of announcement {} that this rank never made",
                        p.who(),
                        h.offset
                    )));
                };
                if let Some(mut a) = p.announced.remove(k) {
                    a.op.cleared = true;
                    p.sends.push_back(a.op);
                }
                continue;
            }
            Head::Imm(v) => {
                let imm = u32::try_from(v).map_err(|_| {
                    Error::Protocol(format!(
                        "shared memory from {}: an immediate of {v:#x}, wider than 32 bits",
                        p.who()
                    ))
                })?;
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                popped = true;
                p.imms.push_back(imm);
                p.wants_imm = false;
                continue;
            }
            Head::Close => {
                if !p.core.posted().is_empty() {
                    return Err(p.closed_error(
                        "shut its communicator down while this rank still expected data from it",
                    ));
                }
                if let Some(conn) = p.conn.as_mut() {
                    conn.rx.pop();
                }
                p.closed = true;
                popped = true;
                break;
            }
            Head::Deliver(i, h) if h.kind == FrameKind::Rendezvous => {
                let r = &p.core.posted()[i];
                let (ptr, len) = (r.dst.0, r.len);
                // SAFETY: matching checked h.total == len, the receive's
                // registered range, bounds-checked at irecv time and kept
                // registered while the receive is posted; the caller promised
                // no concurrent access.
                unsafe { pull_message(p, &h, ptr, len)? };
                popped = true;
                let r = p.core.take(i);
                reqs.finish(r.req, true);
                continue;
            }
            Head::Deliver(i, h) => (i, h),
        };
        let r = &p.core.posted()[i];
        let n = h.len as usize;
        if r.extra.in_place && r.got == 0 && n == r.len && n > 0 {
            // The whole message is this one frame: leave it in the slot.
            if let Some(r) = p.core.delivered(i, &h, n) {
                reqs.finish(r.req, true);
                p.held = Some((r.req, n));
            }
            held = true;
            break;
        }
        let dst: &mut [u8] = if n == 0 {
            &mut []
        } else {
            // SAFETY: h.offset + h.len <= h.total (checked by decode) and h.total ==
            // r.len (checked by matching), so the range lies within the receive's
            // registered bytes, bounds-checked at irecv time and kept registered
            // while the receive is posted; the caller promised no concurrent access.
            unsafe { std::slice::from_raw_parts_mut(r.dst.0.add(h.offset as usize), n) }
        };
        let stream = r.extra.stream;
        let conn = p
            .conn
            .as_mut()
            .ok_or_else(|| Error::Internal("connection vanished".into()))?;
        conn.rx.read_payload_with(dst, stream).map_err(|c| {
            Error::Protocol(format!("shared memory from rank {}: {}", p.info.rank, c.0))
        })?;
        conn.rx.pop();
        popped = true;
        let req = p.core.posted()[i].req;
        match p.core.delivered(i, &h, n) {
            Some(r) => {
                reqs.finish(r.req, true);
                p.active = None;
            }
            None => p.active = Some(req),
        }
    }
    p.publish_consumed();
    // The head a pass moved is told at its end (a pop tells it only every
    // half ring, `Consumer::pop`; the producer finds freed slots by their
    // stamps meanwhile).
    if popped && let Some(conn) = &p.conn {
        conn.rx.publish();
        if conn.rx.take_writer_sleeping() {
            bell.ring(&p.bell);
        }
    }
    Ok(popped || held)
}

impl Transport for ShmTransport {
    fn properties(&self) -> Properties {
        Properties {
            name: "shm",
            bandwidth_gbps: 5.0,
            latency_us: 1.0,
            one_sided_write: true,
            one_sided_read: true,
            // process_vm_writev: the kernel copies, at a quarter of memcpy's
            // speed on the machines measured (docs/performance.md).
            offloaded_writes: false,
            pins_memory: false,
            gpu_memory: false,
            max_segment: self.cfg.slot_bytes,
        }
    }

    fn attach(&mut self, registry: &mio::Registry, token_base: usize) -> Result<()> {
        let token = mio::Token(token_base);
        let addr = doorbell_addr(&self.cfg.name_secret, self.me)?;
        self.bell.attach(&addr, registry, token)?;
        self.token = Some(token);
        Ok(())
    }

    fn connect(&mut self, peer: Rank) -> Result<Readiness> {
        self.check_peer(peer)?;
        let me = self.me;
        let (lo, hi) = (me.min(peer), me.max(peer));
        let path = segment_path(&self.cfg.name_secret, lo, hi);
        let layout = self.layout;
        let creator = &self.peers[lo as usize];
        let (creator_who, creator_pid) = (creator.who(), creator.info.pid);
        let p = &mut self.peers[peer as usize];
        if p.conn.is_some() {
            return Ok(Readiness::Ready);
        }
        p.wanted = true;
        let seg = if me == lo {
            Segment::create(&path, layout, lo, hi)?
        } else {
            match Segment::open(&path, layout, lo, hi, &creator_who, creator_pid)? {
                Opened::Pending => return Ok(Readiness::Pending),
                Opened::Ready(seg) => seg,
            }
        };
        // Ring 0 carries lo -> hi, ring 1 hi -> lo.
        let (out, inb) = if me == lo { (0, 1) } else { (1, 0) };
        let tx = Producer::new(seg.ring(out));
        tx.publish_probe();
        let rx = Consumer::new(seg.ring(inb));
        // The early buffers are made now, for peers this rank talks to only,
        // and the peer is told how many frames they hold.
        p.core.make_buffers(self.cfg.credits());
        rx.publish_credits(p.core.credits());
        p.conn = Some(Conn {
            tx,
            rx,
            probed: false,
            seg,
        });
        // The creator published its probe word already; the opener's comes later.
        probe_peer(p);
        if me == lo {
            // The higher rank may be asleep waiting for the file to appear.
            self.bell.ring(&p.bell);
        }
        tracing::info!("shm: connected to {} through {}", p.who(), path.display());
        Ok(Readiness::Ready)
    }

    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<MemHandle> {
        if ptr.is_null() && len > 0 {
            return Err(Error::InvalidArgument(format!(
                "register: null pointer with {len} bytes"
            )));
        }
        let idx = self.regions.insert(Region {
            ptr: MemPtr(ptr),
            len,
        })?;
        Ok(MemHandle::new(self.id, idx))
    }

    fn deregister(&mut self, mem: MemHandle) -> Result<()> {
        let index = mem.index_for(self.id, "shm")?;
        self.regions.get(index, "deregister")?;
        let busy = self.peers.iter().any(|p| {
            p.sends.iter().any(|s| s.mem == mem)
                || p.core.posted().iter().any(|r| r.extra.mem == mem)
                || p.announced.iter().any(|a| a.op.mem == mem)
                || p.pulls_out.iter().any(|o| o.mem == mem)
        });
        if busy {
            return Err(Error::InvalidUsage(format!(
                "deregister: memory handle {index} is still used by a posted transfer"
            )));
        }
        self.regions.remove(index);
        Ok(())
    }

    fn isend(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.post_send(peer, tag, mem, offset, len, None)
    }

    fn isend_hinted(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
        hint: SendHint,
    ) -> Result<Request> {
        self.post_send(peer, tag, mem, offset, len, Some(hint))
    }

    fn irecv(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.post_recv(peer, tag, mem, offset, len, false)
    }

    fn irecv_in_place(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.post_recv(peer, tag, mem, offset, len, true)
    }

    fn send_now(
        &mut self,
        peer: Rank,
        tag: Tag,
        bytes: &[u8],
        hint: Option<SendHint>,
    ) -> Result<Now> {
        self.check_post(peer)?;
        // Posted with a hint, it would be pulled: one copy instead of two.
        // (Without one the region decides, which only a posted send names.)
        if hint.is_some() && bytes.len() >= self.pull_from(hint, 0) {
            return Ok(Now::Later);
        }
        let me = self.me;
        let p = &mut self.peers[peer as usize];
        let Some(conn) = p.conn.as_mut() else {
            return Ok(Now::Later);
        };
        // Behind queued sends it would overtake them; larger than a slot it
        // is several frames; without a credit it must be announced.
        if !p.sends.is_empty() || !p.ctl.is_empty() || bytes.len() > conn.tx.slot_bytes() {
            return Ok(Now::Later);
        }
        if p.credits(1) == 0 {
            return Ok(Now::Later);
        }
        let Some(conn) = p.conn.as_mut() else {
            return Ok(Now::Later);
        };
        let n = bytes.len() as u64;
        let header = FrameHeader {
            kind: FrameKind::Data,
            cleared: false,
            credits: 0,
            src_rank: me,
            tag,
            offset: 0,
            len: n,
            total: n,
        }
        .encode();
        if !push_frame(&mut conn.tx, p.info.rank, &header, bytes)? {
            return Ok(Now::Later);
        }
        p.sent_eager = p.sent_eager.wrapping_add(1);
        if conn.tx.take_reader_sleeping() {
            self.bell.ring(&p.bell);
        }
        Ok(Now::Done)
    }

    fn recv_now(&mut self, peer: Rank, tag: Tag, dst: &mut [u8]) -> Result<Now> {
        self.check_live(peer)?;
        let me = self.me;
        let p = &mut self.peers[peer as usize];
        // Anything pending with the peer has its order and its checks on the
        // general path.
        if p.closed || !p.core.is_idle() || p.active.is_some() || p.held.is_some() {
            return Ok(Now::Later);
        }
        let Some(conn) = p.conn.as_ref() else {
            return Ok(Now::Later);
        };
        let Some(raw) = conn.rx.peek().map_err(|c| p.corrupt(c))? else {
            return Ok(Now::Empty);
        };
        let Head::Early(h) = examine(p, &conn.rx, &raw)? else {
            return Ok(Now::Later);
        };
        if h.kind != FrameKind::Data || !tag.matches(me, &h, dst.len() as u64)? || h.len != h.total
        {
            return Ok(Now::Later);
        }
        conn.rx.read_payload(dst).map_err(|c| p.corrupt(c))?;
        if let Some(conn) = p.conn.as_mut() {
            free_head(conn, &mut self.bell, &p.bell);
        }
        p.core.consumed(&h);
        p.publish_consumed();
        Ok(Now::Done)
    }

    fn test(&mut self, req: Request) -> Result<Tested> {
        match self.test_in_place(req)? {
            Landed::Pending(r) => Ok(Tested::Pending(r)),
            Landed::Written => Ok(Tested::Done),
            Landed::InPlace { held, .. } => Err(Error::InvalidUsage(format!(
                "request {} completed in place: test it with test_in_place and release it",
                held.id()
            ))),
        }
    }

    fn finished(&self) -> Option<u64> {
        Some(self.reqs.finished())
    }

    fn test_in_place(&mut self, req: Request) -> Result<Landed> {
        let id = req.id_for(self.id, "shm")?;
        match self.reqs.get(&id) {
            None => Err(Error::Internal(format!(
                "shm: request {id} is not in the request table"
            ))),
            Some(false) => Ok(Landed::Pending(req)),
            Some(true) => {
                self.reqs.remove(&id);
                let Some((i, len)) = self.holder(id) else {
                    return Ok(Landed::Written);
                };
                let p = &self.peers[i];
                let conn = p
                    .conn
                    .as_ref()
                    .ok_or_else(|| Error::Internal("connection vanished".into()))?;
                let at = conn.rx.payload_ptr(len).map_err(|c| p.corrupt(c))?;
                Ok(Landed::InPlace { at, held: req })
            }
        }
    }

    fn release_in_place(&mut self, held: Request) -> Result<()> {
        let id = held.id_for(self.id, "shm")?;
        let (i, _) = self.holder(id).ok_or_else(|| {
            Error::InvalidUsage(format!("request {id} holds no message in place"))
        })?;
        let p = &mut self.peers[i];
        p.held = None;
        if let Some(conn) = p.conn.as_mut() {
            free_head(conn, &mut self.bell, &p.bell);
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<bool> {
        if self.aborted {
            return Ok(false);
        }
        let mut did = false;
        for i in 0..self.peers.len() {
            if i == self.me as usize {
                continue;
            }
            let p = &self.peers[i];
            if p.conn.is_none() {
                if !p.wanted && !p.has_ops() {
                    continue;
                }
                if self.connect(i as Rank)? == Readiness::Pending {
                    continue;
                }
                did = true;
            }
            let me = self.me;
            let p = &mut self.peers[i];
            // Before the close check: a peer pulls our message, reports it,
            // and may close right after; that send completed.
            did |= reap_pulls(p, &mut self.reqs);
            if p.closed {
                if !p.sends.is_empty() || !p.pulls_out.is_empty() {
                    return Err(p.closed_error(
                        "shut its communicator down while this rank still had data for it",
                    ));
                }
                continue;
            }
            // Not counted as progress: no transfer moved.
            probe_peer(p);
            did |= pump_sends(me, p, &mut self.bell, &mut self.reqs)?;
        }
        // Decided after the sends went out: only a send that is still stuck
        // makes early frames worth copying out of the rings.
        let eager = self.any_send_stuck();
        for i in 0..self.peers.len() {
            let p = &mut self.peers[i];
            if i == self.me as usize || p.conn.is_none() || p.closed {
                continue;
            }
            did |= pump_recvs(self.me, eager, p, &mut self.bell, &mut self.reqs)?;
        }
        Ok(did)
    }

    fn on_event(&mut self, event: &mio::event::Event) -> Result<()> {
        if Some(event.token()) == self.token {
            self.bell.drain()?;
        }
        Ok(())
    }

    fn prepare_thread(&self) {
        // Pulls and one-sided transfers between near buffers go through a
        // per-thread bounce buffer (`near::bounced`), 260 KiB made at a
        // thread's first such transfer: under load an engine thread's
        // first one came in a persistent all-reduce's steady state
        // (`persistent_no_alloc`, shm one-sided at 4 ranks).
        near::make_bounce();
    }

    fn prepare_sleep(&mut self) -> bool {
        if !self.bell.is_attached() {
            // Nobody can wake us: sleep only if there is nothing to do (the
            // engine's timeout brings us back to poll).
            return !self.has_work();
        }
        self.set_sleep_flags(true);
        self.armed = true;
        // Pairs with the fence a peer issues between publishing (or freeing) a
        // slot and reading our flag: either it sees the flag, or we see its slot.
        fence(Ordering::SeqCst);
        if self.has_work() {
            self.set_sleep_flags(false);
            self.armed = false;
            return false;
        }
        true
    }

    fn finish_sleep(&mut self) {
        if self.armed {
            self.set_sleep_flags(false);
            self.armed = false;
        }
    }

    fn check_peers(&mut self) -> Result<()> {
        for p in &self.peers {
            if p.info.rank == self.me || p.closed || !(p.wanted || p.conn.is_some()) {
                continue;
            }
            if !pid_alive(p.info.pid) {
                return Err(Error::Remote {
                    rank: p.info.rank,
                    addr: p.info.hostname.clone(),
                    what: format!("process {} died", p.info.pid),
                });
            }
        }
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        if self.aborted {
            return;
        }
        self.push_control(FrameKind::Abort, reason);
        // The caller's buffers are handed back after an abort: forget every
        // pointer into them.
        for p in &mut self.peers {
            p.sends.clear();
            p.core.clear();
            p.announced.clear();
            p.ctl.clear();
            p.imm_reqs.clear();
            p.pulls_out.clear();
            p.active = None;
            p.held = None;
            p.imms.clear();
        }
        self.aborted = true;
    }

    fn remote_region(&mut self, mem: MemHandle) -> Result<Option<RemoteRegion>> {
        let index = mem.index_for(self.id, "shm")?;
        let r = self.regions.get(index, "remote_region")?;
        Ok(Some(RemoteRegion {
            rank: self.me,
            key: one_sided::key(self.peers[self.me as usize].info.pid, index),
            addr: r.ptr.0 as u64,
            len: r.len as u64,
        }))
    }

    fn write_imm(&mut self, peer: Rank, w: &WriteImm) -> Result<Request> {
        self.check_post(peer)?;
        let (src, _) = self.range(w.mem, w.offset, w.len, "write_imm")?;
        let me = self.me;
        let p = &self.peers[peer as usize];
        if p.conn.is_none() {
            return Err(Error::InvalidUsage(format!(
                "write_imm to {} before it is connected",
                p.who()
            )));
        }
        let addr = one_sided::target(
            "write_imm",
            &w.remote,
            peer,
            p.info.pid,
            w.remote_offset,
            w.len,
        )?;
        // SAFETY: `range` checked that the bytes lie in memory registered
        // with this transport, which its owner keeps valid while registered.
        let written =
            unsafe { one_sided::copy(Dir::Write, src.0, w.len, p.info.pid, addr, &|| p.who()) };
        if let Err(e) = written {
            return Err(self.write_failed(peer, e));
        }
        // After the bytes: the peer reads the immediate only once they are in.
        let h = FrameHeader {
            offset: u64::from(w.imm),
            ..FrameHeader::control(FrameKind::Imm, me, 0)
        };
        let req = self.new_req();
        let p = &mut self.peers[peer as usize];
        let k = p.queue_ctl(h.encode());
        p.imm_reqs.push_back((k, req));
        pump_sends(me, p, &mut self.bell, &mut self.reqs)?;
        Ok(Request::new(self.id, req))
    }

    fn read(&mut self, peer: Rank, r: &ReadFrom) -> Result<Request> {
        self.check_post(peer)?;
        let (dst, _) = self.range(r.mem, r.offset, r.len, "read")?;
        let p = &self.peers[peer as usize];
        if p.conn.is_none() {
            return Err(Error::InvalidUsage(format!(
                "read from {} before it is connected",
                p.who()
            )));
        }
        let addr = one_sided::target("read", &r.remote, peer, p.info.pid, r.remote_offset, r.len)?;
        // SAFETY: `range` checked that the bytes lie in memory registered
        // with this transport, which its owner keeps valid and lends to it
        // until the request completes (here, before this returns).
        let done =
            unsafe { one_sided::copy(Dir::Read, dst.0, r.len, p.info.pid, addr, &|| p.who()) };
        if let Err(e) = done {
            return Err(self.write_failed(peer, e));
        }
        let req = self.new_req();
        self.reqs.finish(req, true);
        Ok(Request::new(self.id, req))
    }

    fn next_imm(&mut self) -> Result<Option<Arrival>> {
        if self.aborted {
            return Err(Error::Aborted("the shm transport was aborted".into()));
        }
        let n = self.peers.len();
        for k in 0..n {
            let i = (self.imm_cursor + k) % n;
            if let Some(imm) = self.peers[i].imms.pop_front() {
                // Start after this peer next time, so that one busy writer
                // does not hide the others'.
                self.imm_cursor = (i + 1) % n;
                // The caller waits for no more than this now: frames may
                // stay in the rings until a receive wants them again.
                for p in &mut self.peers {
                    p.wants_imm = false;
                }
                return Ok(Some(Arrival {
                    from: Some(i as Rank),
                    imm,
                }));
            }
        }
        // None yet: have progress take frames out of every ring until one
        // comes, even with no receive posted (it may wait behind data).
        for p in &mut self.peers {
            p.wants_imm = p.conn.is_some();
        }
        Ok(None)
    }
}

/// The longest a leaving rank keeps the name of a segment that holds frames
/// for a peer that has not opened it yet (see [`ShmTransport::linger`]).
const LINGER_MAX: Duration = Duration::from_secs(10);

impl ShmTransport {
    /// Peers whose segment this rank made, which they have not opened yet,
    /// and whose ring from this rank holds frames.
    fn unopened_with_frames(&self) -> Vec<usize> {
        let me = self.me as usize;
        (me + 1..self.peers.len())
            .filter(|&i| {
                self.peers[i].conn.as_ref().is_some_and(|c| {
                    !self.peers[i].closed && c.seg.is_named() && c.tx.unread().unwrap_or(false)
                })
            })
            .collect()
    }

    /// Waits, at most [`LINGER_MAX`], until every peer in `waiting` has
    /// opened its segment or its process is gone. A lower rank makes the
    /// segment of a pair when it first sends, and the frames go into it at
    /// once; the higher rank opens it only when it looks for them, which may
    /// be after this rank is done (the last message of a barrier, sent just
    /// before this rank leaves). Unlinked at this rank's exit, the name
    /// would be gone with the frames, and the peer would wait for the
    /// connection until its timeout. Once opened, the mapping is the peer's
    /// too and outlives this rank.
    fn linger(&self, mut waiting: Vec<usize>) {
        let deadline = Instant::now() + LINGER_MAX;
        loop {
            waiting.retain(|&i| {
                let p = &self.peers[i];
                p.conn.as_ref().is_some_and(|c| c.seg.is_named()) && pid_alive(p.info.pid)
            });
            if waiting.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                for &i in &waiting {
                    tracing::warn!(
                        "shm: leaving with frames for {}, which never opened our segment in {:?}",
                        self.peers[i].who(),
                        LINGER_MAX
                    );
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for ShmTransport {
    /// Tells peers this rank is leaving cleanly (best effort), so that a later
    /// exit of this process is not mistaken for a crash while they wait, and
    /// lingers until peers that have frames waiting in segments they have
    /// not opened yet open them ([`ShmTransport::linger`]).
    fn drop(&mut self) {
        if !self.aborted {
            let waiting = self.unopened_with_frames();
            self.push_control(FrameKind::Close, "");
            self.linger(waiting);
        }
    }
}
