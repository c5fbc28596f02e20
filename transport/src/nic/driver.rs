//! The driver of [`super::Nic`]s: one RDM-style transport over any stack
//! that can send into posted receives and write with immediate data.
//!
//! The protocol is the one-sided one of [`crate::rma`]:
//!
//! - every frame (a header, and for eager data its payload) is copied into
//!   one of a fixed set of registered staging buffers and sent; the
//!   receiving rank keeps a fixed set of registered bounce buffers posted,
//!   and matches what lands in them with the receive core
//!   ([`crate::recv_core`]), credits and mismatch errors included;
//! - a message larger than `eager_bytes`, or one without a credit, is
//!   announced (`Rts`); the receiver answers, once the receive is posted
//!   and a slot is free, with a `Grant` frame (address, key, slot); the
//!   sender writes the message straight into the receive with immediate
//!   data, each segment's immediate naming the slot, and the receive
//!   completes when all segments have landed.
//!
//! Immediates arrive without their source (libfabric does not say who
//! wrote), so one grant table is shared by all peers and a slot's request
//! says which peer and receive it is. Every immediate may consume a posted
//! receive (verbs always, libfabric under `FI_RX_CQ_DATA`): the bounce
//! buffer it used is posted again. The bounce buffers form one pool for all
//! peers (libfabric's endpoint; a shared receive queue on verbs).

use super::{Cqe, Nic, NicError, RemoteAt};
use crate::error::{Error, Result};
use crate::recv_core::{Credits, Posted, Posting, RecvCore};
use crate::regions::{Extent, Regions};
use crate::reqmap::{self, ReqMap};
use crate::rma::{GRANT_LEN, Grant, Imm, Receiver, Sender, ToGrant};
use crate::seam::{
    Arrival, MemHandle, MemPtr, POSTED_RESERVED, Properties, Rank, ReadFrom, Readiness,
    RemoteRegion, Request, Tag, Tested, Transport, TransportId, WriteImm,
};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Completions read per poll.
const CQ_BATCH: usize = 64;
/// Bits of a context word below the kind (see [`Ctx`]).
const CTX_KIND_SHIFT: u32 = 62;
/// Bits of a write context holding the request.
const REQ_BITS: u32 = 40;
pub(super) const REQ_MASK: u64 = (1 << REQ_BITS) - 1;
/// Staging buffers for outgoing frames.
const STAGE_BUFFERS: usize = 64;
/// Bytes of an abort frame's reason that are sent.
const MAX_ABORT_TEXT: usize = 512;

/// How the protocol is sized.
#[derive(Clone, Debug)]
pub struct NicConfig {
    /// Largest message sent eagerly (copied into a bounce buffer); larger
    /// ones are written into their receive.
    pub eager_bytes: usize,
    /// Eager messages a peer may send ahead of their receives (credits).
    pub eager_frames: usize,
    /// Receives granted to writers at once, among all peers.
    pub slots: usize,
    /// Largest single write.
    pub segment_bytes: usize,
    /// Writes in flight per peer.
    pub window: usize,
    /// How long an announced send waits for its grant before it is an error.
    pub grant_timeout: Duration,
}

impl Default for NicConfig {
    fn default() -> NicConfig {
        NicConfig {
            eager_bytes: 8 << 10,
            eager_frames: crate::recv_core::DEFAULT_EAGER_FRAMES,
            slots: 256,
            segment_bytes: 1 << 20,
            window: 16,
            grant_timeout: Duration::from_secs(300),
        }
    }
}

/// What a completion's context word names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ctx {
    /// A bounce buffer's receive.
    Bounce(usize),
    /// A staging buffer's send.
    Stage(usize),
    /// A write of request `req` to `peer`.
    Write { peer: Rank, req: u64 },
    /// A one-sided write (`write_imm`) of request `req` to `peer`.
    OneSided { peer: Rank, req: u64 },
}

impl Ctx {
    pub(crate) fn encode(self) -> u64 {
        match self {
            Ctx::Bounce(i) => i as u64,
            Ctx::Stage(i) => (1 << CTX_KIND_SHIFT) | i as u64,
            Ctx::Write { peer, req } => {
                (2 << CTX_KIND_SHIFT) | (u64::from(peer) << REQ_BITS) | (req & REQ_MASK)
            }
            Ctx::OneSided { peer, req } => {
                (3 << CTX_KIND_SHIFT) | (u64::from(peer) << REQ_BITS) | (req & REQ_MASK)
            }
        }
    }

    pub(crate) fn decode(v: u64) -> Option<Ctx> {
        let low = v & ((1 << CTX_KIND_SHIFT) - 1);
        match v >> CTX_KIND_SHIFT {
            0 => Some(Ctx::Bounce(low as usize)),
            1 => Some(Ctx::Stage(low as usize)),
            2 => Some(Ctx::Write {
                peer: (low >> REQ_BITS) as Rank,
                req: low & REQ_MASK,
            }),
            3 => Some(Ctx::OneSided {
                peer: (low >> REQ_BITS) as Rank,
                req: low & REQ_MASK,
            }),
            _ => None,
        }
    }
}

/// The grant-table key of receive `req` from `peer`.
fn slot_key(peer: Rank, req: u64) -> u64 {
    (u64::from(peer) << REQ_BITS) | (req & REQ_MASK)
}

/// A frame waiting for a staging buffer.
#[derive(Debug)]
enum Out {
    /// A whole message sent eagerly; its request completes once copied.
    Eager {
        req: u64,
        tag: Tag,
        src: MemPtr,
        len: usize,
    },
    Rts {
        tag: Tag,
        id: u64,
        len: usize,
    },
    Grant(Grant),
    /// Credits owed and no other frame going that way.
    Credit,
}

/// A large send of ours: where its bytes are, for the writes.
#[derive(Debug)]
struct Big {
    req: u64,
    mem: MemHandle,
    src: MemPtr,
}

/// A one-sided write (`write_imm`) the provider had no room for yet.
#[derive(Debug)]
struct OneSided<L> {
    req: u64,
    /// The local bytes: the source of a write, the destination of a read.
    local: MemPtr,
    len: usize,
    desc: L,
    addr: u64,
    key: u64,
    /// A write's immediate; `None` for a read.
    imm: Option<u32>,
}

/// A one-sided write or read as `write_imm` and `read` hand it to
/// `one_sided_op`.
struct OneSidedOp {
    what: &'static str,
    mem: MemHandle,
    offset: usize,
    len: usize,
    remote: RemoteRegion,
    remote_offset: u64,
    imm: Option<u32>,
}

#[derive(Debug)]
struct RecvExtra {
    mem: MemHandle,
}

#[derive(Debug)]
struct Peer<N: Nic> {
    rank: Rank,
    /// Its endpoint name, from the rendezvous record.
    name: Vec<u8>,
    /// Its pid, when it runs on this host (for `check_peers`).
    local_pid: Option<u32>,
    /// Its host name, for errors.
    host: String,
    /// A send or write to it failed: nothing more is sent to it.
    broken: bool,
    addr: Option<N::Addr>,
    core: RecvCore<RecvExtra>,
    credits: Credits,
    tx: Sender,
    out: VecDeque<Out>,
    big: Vec<Big>,
    /// One-sided writes waiting to be posted, in order.
    one_sided: VecDeque<OneSided<N::Local>>,
    closed: bool,
}

#[derive(Debug)]
struct Region<M> {
    ptr: MemPtr,
    len: usize,
    /// None for an empty region (stacks refuse to register those).
    mr: Option<M>,
}

impl<M> Extent for Region<M> {
    fn base(&self) -> *mut u8 {
        self.ptr.0
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A fixed set of equal registered buffers.
#[derive(Debug)]
struct Pool<M> {
    // Dropped after the registration (field order).
    mr: M,
    bytes: Box<[u8]>,
    each: usize,
    free: Vec<usize>,
}

impl<M> Pool<M> {
    fn new<N: Nic<Mr = M>>(nic: &mut N, n: usize, each: usize) -> Result<Pool<M>> {
        let mut bytes = vec![0u8; n * each].into_boxed_slice();
        // SAFETY: the pool owns the bytes and drops them after the
        // registration (field order), and no transfer outlives the NIC,
        // which the transport drops first.
        let mr = unsafe { nic.register(bytes.as_mut_ptr(), bytes.len()) }.map_err(|e| {
            Error::Config(format!(
                "{}: registering bounce and staging buffers: {e}",
                nic.label()
            ))
        })?;
        Ok(Pool {
            bytes,
            each,
            mr,
            free: (0..n).rev().collect(),
        })
    }

    fn ptr(&mut self, i: usize) -> *mut u8 {
        self.bytes[i * self.each..].as_mut_ptr()
    }

    fn slice(&self, i: usize, n: usize) -> &[u8] {
        &self.bytes[i * self.each..i * self.each + n]
    }
}

/// A peer, as errors name it.
fn who(peer: Rank, label: &str) -> String {
    format!("rank {peer} ({label})")
}

fn remote_err(peer: Rank, label: &str, what: String) -> Error {
    Error::Remote {
        rank: peer,
        addr: label.to_owned(),
        what,
    }
}

/// The hex form of an endpoint name, as published.
pub(crate) fn name_to_hex(name: &[u8]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a published endpoint name.
pub(crate) fn name_from_hex(rank: Rank, what: &str, s: &str) -> Result<Vec<u8>> {
    let bad = || {
        Error::Config(format!(
            "rank {rank} published a malformed {what} endpoint name {s:?}"
        ))
    };
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len() / 2)
        .map(|i| {
            s.get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

/// The transport over NIC `N` (see the module comment).
pub struct NicTransport<N: Nic> {
    id: TransportId,
    me: Rank,
    cfg: NicConfig,
    // Dropped first: no transfer outlives the NIC, then the buffers.
    nic: N,
    peers: Vec<Peer<N>>,
    regions: Regions<Region<N::Mr>>,
    reqs: ReqMap<bool>,
    next_req: u64,
    grants: Receiver,
    bounce: Pool<N::Mr>,
    stage: Pool<N::Mr>,
    /// Per staging buffer in flight: the peer, the frame's kind and the
    /// eager send it carries.
    stage_meta: Vec<(Rank, FrameKind, Option<u64>)>,
    comps: Vec<Cqe>,
    /// Immediates of peers' one-sided writes into published regions, not
    /// taken yet (`next_imm`); completions do not say who wrote.
    imms: VecDeque<u32>,
    epoch: Instant,
    aborted: bool,
    token: Option<mio::Token>,
}

impl<N: Nic> std::fmt::Debug for NicTransport<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicTransport")
            .field("me", &self.me)
            .field("nic", &self.nic.label())
            .finish()
    }
}

impl<N: Nic> NicTransport<N> {
    /// Rank `me` of `world` over `nic`: registers its buffers and posts its
    /// receives; peers are named later ([`NicTransport::set_peer_names`]).
    /// `max_msg` is the largest message the stack moves at once.
    pub fn new(
        mut nic: N,
        me: Rank,
        world: usize,
        cfg: NicConfig,
        max_msg: usize,
    ) -> Result<NicTransport<N>> {
        if me as usize >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {me} is outside a world of {world} ranks"
            )));
        }
        if cfg.eager_bytes == 0 || cfg.segment_bytes == 0 || cfg.window == 0 || cfg.slots == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: eager bytes, segment bytes, window and slots must be at least 1 ({cfg:?})",
                N::NAME
            )));
        }
        let segment = cfg.segment_bytes.min(max_msg.max(1));
        let each = HEADER_LEN + cfg.eager_bytes.max(GRANT_LEN).max(MAX_ABORT_TEXT);
        let nbounce = Self::bounce_buffers(world, cfg.eager_frames);
        let mut bounce = Pool::new(&mut nic, nbounce, each)?;
        let stage = Pool::new(&mut nic, STAGE_BUFFERS, each)?;
        let peers = (0..world as Rank)
            .map(|rank| -> Result<Peer<N>> {
                Ok(Peer {
                    rank,
                    name: Vec::new(),
                    local_pid: None,
                    host: String::new(),
                    broken: false,
                    addr: None,
                    core: RecvCore::new(me, rank, cfg.eager_frames, cfg.eager_bytes),
                    credits: Credits::new(cfg.eager_frames),
                    tx: Sender::new(rank, segment, cfg.window)?,
                    out: VecDeque::with_capacity(POSTED_RESERVED),
                    big: Vec::with_capacity(POSTED_RESERVED),
                    one_sided: VecDeque::with_capacity(POSTED_RESERVED),
                    closed: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        bounce.free.clear();
        for i in 0..nbounce {
            post_bounce(&mut nic, &mut bounce, i)?;
        }
        Ok(NicTransport {
            id: TransportId::next(),
            me,
            grants: Receiver::shared(cfg.slots.min(crate::rma::MAX_SLOTS), segment)?,
            cfg,
            nic,
            peers,
            regions: Regions::new(),
            reqs: reqmap::with_capacity(crate::seam::REQS_RESERVED),
            next_req: 1,
            bounce,
            stage,
            stage_meta: vec![(0, FrameKind::Credit, None); STAGE_BUFFERS],
            comps: vec![Cqe::default(); CQ_BATCH],
            imms: VecDeque::with_capacity(crate::seam::REQS_RESERVED),
            epoch: Instant::now(),
            aborted: false,
            token: None,
        })
    }

    /// The early buffers kept for eager frames from `peer` (its credits).
    #[cfg(test)]
    pub(crate) fn early_buffers(&self, peer: Rank) -> usize {
        self.peers[peer as usize].core.buffers()
    }

    /// How many bounce buffers a rank of `world` keeps posted: enough for
    /// every peer's credits and a few control frames each, within bounds
    /// (what a stack's receive queue must hold).
    pub fn bounce_buffers(world: usize, eager_frames: usize) -> usize {
        (world.saturating_sub(1) * (eager_frames + 4)).clamp(16, 4096)
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.me
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.peers.len()
    }

    /// The NIC under the protocol.
    pub fn nic(&self) -> &N {
        &self.nic
    }

    /// This rank's endpoint name, to publish (hex).
    pub fn name_hex(&self) -> Result<String> {
        let n = self.nic.name().map_err(|e| {
            Error::Config(format!(
                "{}: reading the endpoint name: {e}",
                self.nic.label()
            ))
        })?;
        Ok(name_to_hex(&n))
    }

    /// Every rank's rendezvous record, indexed by rank: endpoint names, and
    /// the pids of same-host peers, whose death [`Transport::check_peers`]
    /// then notices (a provider tells of a dead peer only when a send to
    /// it fails, so a rank that only waits to receive would otherwise wait
    /// for the timeout).
    pub fn set_peers(&mut self, infos: &[gw_rendezvous::PeerInfo]) -> Result<()> {
        let names: Vec<String> = infos.iter().map(|p| p.ofi.clone()).collect();
        self.set_peer_names(&names)?;
        let mine = infos.get(self.me as usize).map(|p| p.host_id.clone());
        for (p, info) in self.peers.iter_mut().zip(infos) {
            if p.rank != self.me && Some(&info.host_id) == mine.as_ref() {
                p.local_pid = Some(info.pid);
            }
            p.host = info.hostname.clone();
        }
        Ok(())
    }

    /// Every rank's published endpoint name (hex), indexed by rank.
    pub fn set_peer_names(&mut self, names: &[String]) -> Result<()> {
        if names.len() != self.peers.len() {
            return Err(Error::InvalidArgument(format!(
                "{} endpoint names for a world of {}",
                names.len(),
                self.peers.len()
            )));
        }
        for (p, n) in self.peers.iter_mut().zip(names) {
            if p.rank != self.me {
                p.name = name_from_hex(p.rank, N::NAME, n)?;
            }
        }
        Ok(())
    }

    fn who(&self, peer: Rank) -> String {
        who(peer, self.nic.label())
    }

    fn remote_err(&self, peer: Rank, what: String) -> Error {
        remote_err(peer, self.nic.label(), what)
    }

    fn check_post(&self, peer: Rank) -> Result<()> {
        if self.aborted {
            return Err(Error::Aborted(format!(
                "the {} transport was aborted",
                N::NAME
            )));
        }
        if peer as usize >= self.peers.len() || peer == self.me {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} is not a peer of rank {} in a world of {}",
                self.me,
                self.peers.len()
            )));
        }
        let p = &self.peers[peer as usize];
        if p.addr.is_none() {
            return Err(Error::InvalidUsage(format!(
                "{} is not connected",
                self.who(peer)
            )));
        }
        if p.closed {
            return Err(self.remote_err(
                peer,
                "has shut its communicator down; nothing more can be exchanged with it".into(),
            ));
        }
        Ok(())
    }

    fn range(
        &self,
        mem: MemHandle,
        offset: usize,
        len: usize,
        what: &str,
    ) -> Result<(MemPtr, u32)> {
        let index = mem.index_for(self.id, N::NAME)?;
        let (at, _) = self.regions.range(index, offset, len, what)?;
        Ok((MemPtr(at), index))
    }

    fn new_req(&mut self) -> u64 {
        let id = self.next_req;
        self.next_req += 1;
        self.reqs.insert(id, false);
        id
    }

    /// Posts bounce buffer `b` again once its frame is read.
    fn repost(&mut self, b: usize) -> Result<()> {
        post_bounce(&mut self.nic, &mut self.bounce, b)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Grants receive `i` of `peer` (announced as `id`) to its writer.
    fn grant(&mut self, peer: Rank, i: usize, id: u64) -> Result<()> {
        let r = &self.peers[peer as usize].core.posted()[i];
        let (req, dst, len, mem) = (r.req, r.dst, r.len, r.extra.mem);
        let index = mem.index_for(self.id, N::NAME)?;
        let region = self
            .regions
            .get(index, "grant")
            .map_err(|_| Error::Internal(format!("receive {req} lost its region")))?;
        // An empty message is one empty write, aimed at a registration
        // that exists (the staging buffers') since its own has none.
        let (mr, at) = match &region.mr {
            Some(mr) if len > 0 => (mr, dst.0.cast_const()),
            _ => (&self.stage.mr, self.stage.bytes.as_ptr()),
        };
        let addr = N::remote_addr(mr, at).ok_or_else(|| {
            Error::Internal(format!("receive {req} lies outside its registration"))
        })?;
        self.grants.clear_to_send(ToGrant {
            id,
            req: slot_key(peer, req),
            addr,
            key: N::key(mr),
            len: len as u64,
        })?;
        self.queue_grants();
        Ok(())
    }

    fn queue_grants(&mut self) {
        while let Some((g, key)) = self.grants.next_grant() {
            let peer = (key >> REQ_BITS) as usize;
            if let Some(p) = self.peers.get_mut(peer) {
                p.out.push_back(Out::Grant(g));
            }
        }
    }

    /// Queues a `Credit` frame to `peer` once half its credits are owed,
    /// unless one is queued already (every frame sent carries what is owed
    /// then).
    fn owe_credits(&mut self, peer: Rank) {
        let half = (self.cfg.eager_frames as u32).div_ceil(2);
        let p = &mut self.peers[peer as usize];
        if p.core.owed() >= half && !p.out.iter().any(|o| matches!(o, Out::Credit)) {
            p.out.push_back(Out::Credit);
        }
    }

    /// An immediate landed.
    fn on_imm(&mut self, data: u64) -> Result<()> {
        let Ok(v) = u32::try_from(data) else {
            return Err(Error::Protocol(format!(
                "a peer wrote with immediate data {data:#x}, wider than gradwire's 32 bits"
            )));
        };
        match Imm::decode(v) {
            Imm::Message { slot, generation } => {
                if let Some(key) = self.grants.landed(slot, generation)? {
                    let (peer, req) = ((key >> REQ_BITS) as Rank, key & REQ_MASK);
                    let p = self
                        .peers
                        .get_mut(peer as usize)
                        .ok_or_else(|| Error::Internal(format!("grant for rank {peer}")))?;
                    let i = p.core.index_of(req).ok_or_else(|| {
                        Error::Internal(format!("granted receive {req} vanished"))
                    })?;
                    let r = p.core.take(i);
                    self.reqs.insert(r.req, true);
                }
                self.queue_grants();
                Ok(())
            }
            Imm::Window { .. } => {
                self.imms.push_back(v);
                Ok(())
            }
        }
    }

    /// A frame landed in bounce buffer `b` (`n` bytes).
    fn on_frame(&mut self, b: usize, n: usize) -> Result<()> {
        let me = self.me;
        let raw = self.bounce.slice(b, n);
        let h = FrameHeader::decode(raw)
            .map_err(|e| Error::Protocol(format!("{} frame from a peer: {e}", N::NAME)))?;
        let peer = h.src_rank;
        if peer as usize >= self.peers.len() || peer == me {
            return Err(Error::Protocol(format!(
                "{} frame claims to come from rank {peer}",
                N::NAME
            )));
        }
        if n < HEADER_LEN + h.len as usize {
            return Err(Error::Protocol(format!(
                "{}: a frame of {n} bytes announcing a {}-byte payload",
                self.who(peer),
                h.len
            )));
        }
        let p = &mut self.peers[peer as usize];
        p.credits.give_back(h.credits, peer)?;
        let payload_at = b * self.bounce.each + HEADER_LEN;
        let payload = &self.bounce.bytes[payload_at..payload_at + h.len as usize];
        match h.kind {
            FrameKind::Data => {
                if h.offset != 0 || h.len != h.total {
                    return Err(Error::Protocol(format!(
                        "{}: an eager frame with bytes [{}, +{}) of {} ({} sends whole messages)",
                        who(peer, self.nic.label()),
                        h.offset,
                        h.len,
                        h.total,
                        N::NAME
                    )));
                }
                if let Some(i) = p.core.find(&h)? {
                    let r = &p.core.posted()[i];
                    // SAFETY: matching checked total == r.len, and the
                    // receive's range was bounds-checked at irecv and stays
                    // registered while it is posted.
                    if !payload.is_empty() {
                        unsafe {
                            std::ptr::copy_nonoverlapping(payload.as_ptr(), r.dst.0, payload.len())
                        };
                    }
                    if let Some(r) = p.core.delivered(i, &h, payload.len()) {
                        self.reqs.insert(r.req, true);
                    }
                } else {
                    let (eb, buf) = p.core.early_buffer(&h)?;
                    buf.copy_from_slice(payload);
                    if let Some(r) = p.core.file(h, eb)? {
                        self.reqs.insert(r.req, true);
                    }
                }
            }
            FrameKind::Rts => {
                if let Some((i, id, ())) = p.core.announce(h, ())? {
                    self.grant(peer, i, id)?;
                }
            }
            FrameKind::Grant => {
                let g = Grant::decode(peer, payload)?;
                p.tx.granted(g)?;
            }
            FrameKind::Credit => {}
            FrameKind::Close => {
                if !p.core.posted().is_empty() {
                    return Err(remote_err(
                        peer,
                        self.nic.label(),
                        "shut its communicator down while this rank still expected data from it"
                            .into(),
                    ));
                }
                p.closed = true;
            }
            FrameKind::Abort => {
                let text = String::from_utf8_lossy(payload).into_owned();
                return Err(remote_err(
                    peer,
                    self.nic.label(),
                    format!("aborted: {text}"),
                ));
            }
            FrameKind::Cts
            | FrameKind::Rendezvous
            | FrameKind::Imm
            | FrameKind::Put
            | FrameKind::Get
            | FrameKind::Fetched => {
                return Err(Error::Protocol(format!(
                    "{} sent a {:?} frame, which the {} transport does not use",
                    who(peer, self.nic.label()),
                    h.kind,
                    N::NAME
                )));
            }
        }
        self.owe_credits(peer);
        Ok(())
    }

    fn on_completion(&mut self, c: Cqe) -> Result<()> {
        let ctx = c.ctx.and_then(Ctx::decode);
        if let Some(imm) = c.imm {
            self.on_imm(imm)?;
            // The immediate used up a bounce buffer (verbs; libfabric under
            // FI_RX_CQ_DATA).
            if let Some(Ctx::Bounce(b)) = ctx {
                self.repost(b)?;
            }
            return Ok(());
        }
        match ctx {
            Some(Ctx::Bounce(b)) => {
                let r = self.on_frame(b, c.len);
                self.repost(b)?;
                r
            }
            Some(Ctx::Stage(s)) => {
                self.stage.free.push(s);
                // An eager message is sent once its frame is: only then may
                // a failure no longer be reported against it.
                if let (_, _, Some(req)) = self.stage_meta[s] {
                    self.reqs.insert(req, true);
                }
                Ok(())
            }
            Some(Ctx::OneSided { req, .. }) => {
                self.reqs.insert(req, true);
                Ok(())
            }
            Some(Ctx::Write { peer, req }) => {
                let p = self
                    .peers
                    .get_mut(peer as usize)
                    .ok_or_else(|| Error::Internal(format!("a write to rank {peer}")))?;
                if let Some(req) = p.tx.written(req)? {
                    p.big.retain(|b| b.req != req);
                    self.reqs.insert(req, true);
                }
                Ok(())
            }
            None => Err(Error::Internal(format!(
                "{}: a completion with an unknown context ({c:?})",
                self.nic.label()
            ))),
        }
    }

    /// Reads every completion there is.
    fn reap(&mut self) -> Result<bool> {
        let mut did = false;
        loop {
            let mut comps = std::mem::take(&mut self.comps);
            let got = self.nic.poll(&mut comps);
            let n = match got {
                Ok(n) => n,
                Err(e) => {
                    self.comps = comps;
                    if self.failed_send_is_harmless(&e) {
                        did = true;
                        continue;
                    }
                    let err = self.completion_error(e);
                    if let Error::Remote { rank, .. } = &err
                        && let Some(p) = self.peers.get_mut(*rank as usize)
                    {
                        p.broken = true;
                    }
                    return Err(err);
                }
            };
            let mut res = Ok(());
            for &c in &comps[..n] {
                if res.is_ok() {
                    res = self.on_completion(c);
                }
            }
            self.comps = comps;
            res?;
            if n == 0 {
                return Ok(did);
            }
            did = true;
        }
    }

    /// A staging buffer's send failed: frees the buffer and says whether
    /// losing the frame harms nothing (credits for a peer that has left,
    /// whose last receive is done, are owed to nobody).
    fn failed_send_is_harmless(&mut self, e: &NicError) -> bool {
        let NicError::Completion { ctx, .. } = e else {
            return false;
        };
        let Some(Ctx::Stage(s)) = ctx.and_then(Ctx::decode) else {
            return false;
        };
        self.stage.free.push(s);
        let (peer, kind, _) = self.stage_meta[s];
        if kind == FrameKind::Credit {
            if let Some(p) = self.peers.get_mut(peer as usize) {
                p.broken = true;
            }
            tracing::debug!(
                "{}: credits for rank {peer} were not delivered: {e}",
                self.nic.label()
            );
            return true;
        }
        false
    }

    fn completion_error(&self, e: NicError) -> Error {
        if let NicError::Completion { ctx, .. } = &e
            && let Some(Ctx::Write { peer, .. } | Ctx::OneSided { peer, .. }) =
                ctx.and_then(Ctx::decode)
        {
            return self.remote_err(
                peer,
                format!("a one-sided write failed: {e} (check that the peer is alive and its region still registered)"),
            );
        }
        if let NicError::Completion { ctx, .. } = &e
            && let Some(Ctx::Stage(s)) = ctx.and_then(Ctx::decode)
        {
            let (peer, kind, _) = self.stage_meta[s];
            return self.remote_err(
                peer,
                format!("sending a {kind:?} frame failed: {e} (has the peer exited or lost its connection?)"),
            );
        }
        Error::Internal(format!("{}: {e}", self.nic.label()))
    }

    /// Sends what each peer has queued, as staging buffers and the
    /// provider's queue allow; then its writes.
    fn pump(&mut self) -> Result<bool> {
        let mut did = false;
        let me = self.me;
        for i in 0..self.peers.len() {
            let Some(addr) = self.peers[i].addr else {
                continue;
            };
            while let Some(s) = self.stage.free.pop() {
                let p = &mut self.peers[i];
                let Some(o) = p.out.front() else {
                    self.stage.free.push(s);
                    break;
                };
                let credits = p.core.take_owed(1);
                let (h, body): (FrameHeader, &[u8]) = match o {
                    Out::Eager { tag, src, len, .. } => (
                        FrameHeader {
                            kind: FrameKind::Data,
                            cleared: false,
                            credits,
                            src_rank: me,
                            tag: *tag,
                            offset: 0,
                            len: *len as u64,
                            total: *len as u64,
                        },
                        if *len == 0 {
                            &[]
                        } else {
                            // SAFETY: the send's range was bounds-checked at
                            // isend and its memory stays registered and
                            // unchanged until the request completes, which
                            // is after this copy.
                            unsafe { std::slice::from_raw_parts(src.0, *len) }
                        },
                    ),
                    Out::Rts { tag, id, len } => (
                        FrameHeader {
                            kind: FrameKind::Rts,
                            cleared: false,
                            credits,
                            src_rank: me,
                            tag: *tag,
                            offset: *id,
                            len: 0,
                            total: *len as u64,
                        },
                        &[],
                    ),
                    Out::Grant(_) => (
                        FrameHeader {
                            credits,
                            ..FrameHeader::control(FrameKind::Grant, me, GRANT_LEN)
                        },
                        &[],
                    ),
                    Out::Credit => (
                        FrameHeader {
                            credits,
                            ..FrameHeader::control(FrameKind::Credit, me, 0)
                        },
                        &[],
                    ),
                };
                let at = s * self.stage.each;
                self.stage.bytes[at..at + HEADER_LEN].copy_from_slice(&h.encode());
                let mut n = HEADER_LEN + body.len();
                self.stage.bytes[at + HEADER_LEN..at + n].copy_from_slice(body);
                if let Out::Grant(g) = o {
                    self.stage.bytes[at + HEADER_LEN..at + HEADER_LEN + GRANT_LEN]
                        .copy_from_slice(&g.encode());
                    n = HEADER_LEN + GRANT_LEN;
                }
                let desc = N::local(&self.stage.mr);
                let ptr = self.stage.ptr(s);
                // SAFETY: the staging buffer is ours until its send
                // completes (it returns to `free` only then).
                let sent = unsafe { self.nic.send(ptr, n, desc, addr, Ctx::Stage(s).encode()) };
                match sent {
                    Ok(()) => {}
                    Err(NicError::Again) => {
                        // Nothing was sent: the credits go back to owed.
                        p.core.give_owed(credits);
                        self.stage.free.push(s);
                        break;
                    }
                    Err(e) => {
                        return Err(remote_err(
                            p.rank,
                            self.nic.label(),
                            format!("sending a frame failed: {e}"),
                        ));
                    }
                }
                did = true;
                let req = match p.out.pop_front() {
                    Some(Out::Eager { req, .. }) => Some(req),
                    _ => None,
                };
                self.stage_meta[s] = (p.rank, h.kind, req);
            }
            did |= self.pump_writes(i, addr)?;
            did |= self.pump_one_sided(i, addr)?;
        }
        Ok(did)
    }

    /// Posts `write_imm`s to peer `i` that waited for room, in order.
    /// Checks a one-sided write or read against the peer, the local
    /// registration and the published region, queues it and posts what the
    /// provider takes now.
    fn one_sided_op(&mut self, peer: Rank, op: &OneSidedOp) -> Result<Request> {
        let what = op.what;
        self.check_post(peer)?;
        if self.peers[peer as usize].broken {
            return Err(self.remote_err(peer, "an earlier transfer to it failed".into()));
        }
        let (local, index) = self.range(op.mem, op.offset, op.len, what)?;
        if op.remote.rank != peer {
            return Err(Error::InvalidArgument(format!(
                "{what} of rank {peer} with a region rank {} published",
                op.remote.rank
            )));
        }
        if op.len > self.cfg.segment_bytes {
            return Err(Error::InvalidArgument(format!(
                "{what} of {} bytes: the {} transport moves at most {} at once (Properties::max_segment)",
                op.len,
                N::NAME,
                self.cfg.segment_bytes
            )));
        }
        let addr = op
            .remote_offset
            .checked_add(op.len as u64)
            .filter(|&end| end <= op.remote.len)
            .and_then(|_| op.remote.addr.checked_add(op.remote_offset))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{what} of rank {peer}: [{}, +{}) lies outside its published region of {} bytes",
                    op.remote_offset, op.len, op.remote.len
                ))
            })?;
        let region = self.regions.get(index, what)?;
        let (local, desc) = match &region.mr {
            Some(mr) if op.len > 0 => (local, N::local(mr)),
            // An empty write still carries its immediate; providers want
            // a registered buffer even for no bytes.
            _ => (
                MemPtr(self.stage.bytes.as_ptr().cast_mut()),
                N::local(&self.stage.mr),
            ),
        };
        let req = self.new_req();
        self.peers[peer as usize].one_sided.push_back(OneSided {
            req,
            local,
            len: op.len,
            desc,
            addr,
            key: op.remote.key,
            imm: op.imm,
        });
        if let Some(dest) = self.peers[peer as usize].addr {
            self.pump_one_sided(peer as usize, dest)?;
        }
        Ok(Request::new(self.id, req))
    }

    fn pump_one_sided(&mut self, i: usize, dest: N::Addr) -> Result<bool> {
        let mut did = false;
        while let Some(w) = self.peers[i].one_sided.front() {
            let remote = RemoteAt {
                peer: dest,
                addr: w.addr,
                key: w.key,
            };
            let ctx = Ctx::OneSided {
                peer: i as Rank,
                req: w.req,
            }
            .encode();
            // SAFETY: `write_imm` and `read` checked that the bytes lie in
            // a region registered here; its caller keeps them (unchanged,
            // for a write; untouched, for a read) until the request
            // completes, after this operation's completion.
            let r = unsafe {
                match w.imm {
                    Some(imm) => self
                        .nic
                        .write_imm(w.local.0, w.len, w.desc, imm, remote, ctx),
                    None => self.nic.read(w.local.0, w.len, w.desc, remote, ctx),
                }
            };
            match r {
                Ok(()) => {
                    self.peers[i].one_sided.pop_front();
                    did = true;
                }
                Err(NicError::Again) => break,
                Err(e) => {
                    let what = if w.imm.is_some() { "write" } else { "read" };
                    return Err(self
                        .remote_err(i as Rank, format!("posting a one-sided {what} failed: {e}")));
                }
            }
        }
        Ok(did)
    }

    fn pump_writes(&mut self, i: usize, dest: N::Addr) -> Result<bool> {
        let mut did = false;
        let peer = i as Rank;
        while let Some(w) = self.peers[i].tx.next_write() {
            let p = &self.peers[i];
            let Some(b) = p.big.iter().find(|b| b.req == w.req) else {
                return Err(Error::Internal(format!("write of unknown send {}", w.req)));
            };
            let index = b.mem.index_for(self.id, N::NAME)?;
            let region = self
                .regions
                .get(index, "write")
                .map_err(|_| Error::Internal(format!("send {} lost its region", w.req)))?;
            let (desc, src) = match &region.mr {
                Some(mr) if w.len > 0 => {
                    (N::local(mr), b.src.0.wrapping_add(w.offset).cast_const())
                }
                _ => (N::local(&self.stage.mr), self.stage.bytes.as_ptr()),
            };
            let remote = RemoteAt {
                peer: dest,
                addr: w.remote_addr,
                key: w.key,
            };
            // SAFETY: the send's bytes stay registered and unchanged until
            // its request completes, after every write's completion.
            let r = unsafe {
                self.nic.write_imm(
                    src,
                    w.len,
                    desc,
                    w.imm,
                    remote,
                    Ctx::Write { peer, req: w.req }.encode(),
                )
            };
            match r {
                Ok(()) => did = true,
                Err(NicError::Again) => {
                    self.peers[i].tx.unwrite(&w)?;
                    break;
                }
                Err(e) => {
                    return Err(
                        self.remote_err(peer, format!("posting a one-sided write failed: {e}"))
                    );
                }
            }
        }
        Ok(did)
    }
}

/// Posts bounce buffer `i` for an incoming frame.
fn post_bounce<N: Nic>(nic: &mut N, pool: &mut Pool<N::Mr>, i: usize) -> Result<()> {
    let desc = N::local(&pool.mr);
    let each = pool.each;
    let ptr = pool.ptr(i);
    // SAFETY: the buffer is the pool's and is read only after this
    // receive completes; the pool outlives the NIC.
    match unsafe { nic.recv(ptr, each, desc, Ctx::Bounce(i).encode()) } {
        Ok(()) => Ok(()),
        Err(e) => Err(Error::Internal(format!(
            "{}: posting a receive buffer failed: {e}",
            nic.label()
        ))),
    }
}

impl<N: Nic> Transport for NicTransport<N> {
    fn properties(&self) -> Properties {
        Properties {
            name: N::NAME,
            bandwidth_gbps: 10.0,
            latency_us: 5.0,
            one_sided_write: true,
            one_sided_read: true,
            offloaded_writes: self.nic.offloaded(),
            pins_memory: true,
            gpu_memory: false,
            max_segment: self.cfg.segment_bytes,
        }
    }

    fn attach(&mut self, registry: &mio::Registry, token_base: usize) -> Result<()> {
        if let Some(fd) = self.nic.wait_fd() {
            let token = mio::Token(token_base);
            registry
                .register(
                    &mut mio::unix::SourceFd(&fd),
                    token,
                    mio::Interest::READABLE,
                )
                .map_err(|source| Error::Sys {
                    syscall: "epoll_ctl",
                    context: format!("watching the {} completion queue", self.nic.label()),
                    source,
                })?;
            self.token = Some(token);
        }
        Ok(())
    }

    fn connect(&mut self, peer: Rank) -> Result<Readiness> {
        if peer as usize >= self.peers.len() || peer == self.me {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} is not a peer of rank {} in a world of {}",
                self.me,
                self.peers.len()
            )));
        }
        let p = &mut self.peers[peer as usize];
        if p.addr.is_some() {
            return Ok(Readiness::Ready);
        }
        if p.name.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "rank {peer} published no {} endpoint name",
                N::NAME
            )));
        }
        let addr = self.nic.connect(peer, &p.name).map_err(|e| {
            Error::Config(format!(
                "{}: adding rank {peer}'s address: {e}",
                self.nic.label()
            ))
        })?;
        p.addr = Some(addr);
        Ok(Readiness::Ready)
    }

    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<MemHandle> {
        if ptr.is_null() && len > 0 {
            return Err(Error::InvalidArgument(format!(
                "register: null pointer with {len} bytes"
            )));
        }
        // Stacks refuse empty registrations; transfers of an empty region
        // move no bytes and use the staging buffers' registration.
        let mr = if len == 0 {
            None
        } else {
            // SAFETY: the caller keeps the memory valid while registered.
            Some(unsafe { self.nic.register(ptr, len) }.map_err(|e| {
                Error::Config(format!(
                    "{}: registering {len} bytes at {ptr:p}: {e}",
                    self.nic.label()
                ))
            })?)
        };
        let idx = self.regions.insert(Region {
            ptr: MemPtr(ptr),
            len,
            mr,
        })?;
        Ok(MemHandle::new(self.id, idx))
    }

    fn deregister(&mut self, mem: MemHandle) -> Result<()> {
        let index = mem.index_for(self.id, N::NAME)?;
        self.regions.get(index, "deregister")?;
        let busy = self.peers.iter().any(|p| {
            p.big.iter().any(|b| b.mem == mem) || p.core.posted().iter().any(|r| r.extra.mem == mem)
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
        self.check_post(peer)?;
        let (src, _) = self.range(mem, offset, len, "isend")?;
        let req = self.new_req();
        let now = self.now_ns();
        let eager = self.cfg.eager_bytes;
        let p = &mut self.peers[peer as usize];
        if len <= eager && p.credits.take(1) {
            p.out.push_back(Out::Eager { req, tag, src, len });
        } else {
            let id = p.tx.announce(req, tag, len, now);
            p.big.push(Big { req, mem, src });
            p.out.push_back(Out::Rts { tag, id, len });
        }
        Ok(Request::new(self.id, req))
    }

    fn irecv(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.check_post(peer)?;
        let (dst, _) = self.range(mem, offset, len, "irecv")?;
        let req = self.new_req();
        let p = &mut self.peers[peer as usize];
        let posted = Posted::new(req, tag, dst, len, RecvExtra { mem });
        // SAFETY: `range` checked the bytes lie in registered memory, which
        // stays valid while the receive is posted.
        match unsafe { p.core.post(posted)? } {
            Posting::Done => {
                self.reqs.insert(req, true);
            }
            Posting::Pending => {}
            Posting::Clear { id, a: () } => {
                let i = p
                    .core
                    .index_of(req)
                    .ok_or_else(|| Error::Internal("cleared receive not posted".into()))?;
                self.grant(peer, i, id)?;
            }
        }
        self.owe_credits(peer);
        Ok(Request::new(self.id, req))
    }

    fn test(&mut self, req: Request) -> Result<Tested> {
        let id = req.id_for(self.id, N::NAME)?;
        match self.reqs.get(&id) {
            None => Err(Error::InvalidArgument(format!(
                "test: request {id} is unknown (already completed?)"
            ))),
            Some(false) => Ok(Tested::Pending(req)),
            Some(true) => {
                self.reqs.remove(&id);
                Ok(Tested::Done)
            }
        }
    }

    fn progress(&mut self) -> Result<bool> {
        if self.aborted {
            return Ok(false);
        }
        let mut did = self.reap()?;
        did |= self.pump()?;
        // Sends posted just now may complete at once on fast providers.
        did |= self.reap()?;
        Ok(did)
    }

    fn on_event(&mut self, _event: &mio::event::Event) -> Result<()> {
        Ok(())
    }

    fn prepare_sleep(&mut self) -> bool {
        if self.peers.iter().any(|p| !p.out.is_empty()) {
            return false;
        }
        if self.nic.wait_fd().is_none() {
            // Nothing would wake the engine (shm offers no wait object): it
            // may sleep only with nothing of ours in flight. What arrives
            // meanwhile is for operations not posted yet, taken in when the
            // next one wakes the engine.
            return self.reqs.values().all(|done| *done)
                && self.peers.iter().all(|p| p.tx.is_idle())
                && self.grants.is_idle();
        }
        self.nic.trywait()
    }

    fn check_peers(&mut self) -> Result<()> {
        let now = self.now_ns();
        let timeout = u64::try_from(self.cfg.grant_timeout.as_nanos()).unwrap_or(u64::MAX);
        for p in &self.peers {
            if let Some(pid) = p.local_pid
                && p.addr.is_some()
                && !p.closed
                && !crate::shm::pid_alive(pid)
            {
                return Err(Error::Remote {
                    rank: p.rank,
                    addr: p.host.clone(),
                    what: format!("process {pid} died"),
                });
            }
            p.tx.check(now, timeout)?;
        }
        Ok(())
    }

    /// Tells connected peers why: one frame each, sent once from a staging
    /// buffer and never retried, skipping peers known to be gone (a
    /// same-host peer whose process died, or one a send already failed to:
    /// libfabric 1.17's rxm crashes on a send to a peer whose endpoint is
    /// gone, so nothing is sent at a clean shutdown either). The reason
    /// must travel whole: a rank that learns of the failure from this
    /// frame names the cause from it. The completion queue is then driven
    /// briefly so that a manual-progress provider sends the frames.
    fn remote_region(&mut self, mem: MemHandle) -> Result<Option<RemoteRegion>> {
        let index = mem.index_for(self.id, N::NAME)?;
        let r = self.regions.get(index, "remote_region")?;
        let (key, addr) = match &r.mr {
            // Under FI_MR_VIRT_ADDR peers address it by its own address,
            // otherwise by the offset from its start.
            Some(mr) => (N::key(mr), N::remote_addr(mr, N::base(mr)).unwrap_or(0)),
            None => (0, 0),
        };
        Ok(Some(RemoteRegion {
            rank: self.me,
            key,
            addr,
            len: r.len as u64,
        }))
    }

    fn write_imm(&mut self, peer: Rank, w: &WriteImm) -> Result<Request> {
        let op = OneSidedOp {
            what: "write_imm",
            mem: w.mem,
            offset: w.offset,
            len: w.len,
            remote: w.remote,
            remote_offset: w.remote_offset,
            imm: Some(w.imm),
        };
        self.one_sided_op(peer, &op)
    }

    fn read(&mut self, peer: Rank, r: &ReadFrom) -> Result<Request> {
        let op = OneSidedOp {
            what: "read",
            mem: r.mem,
            offset: r.offset,
            len: r.len,
            remote: r.remote,
            remote_offset: r.remote_offset,
            imm: None,
        };
        self.one_sided_op(peer, &op)
    }

    fn next_imm(&mut self) -> Result<Option<Arrival>> {
        if self.aborted {
            return Err(Error::Aborted(format!(
                "the {} transport was aborted",
                N::NAME
            )));
        }
        if self.imms.is_empty() {
            self.reap()?;
        }
        Ok(self.imms.pop_front().map(|imm| Arrival { from: None, imm }))
    }

    fn abort(&mut self, reason: &str) {
        if self.aborted {
            return;
        }
        let me = self.me;
        let mut end = reason.len().min(MAX_ABORT_TEXT);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let text = &reason.as_bytes()[..end];
        let h = FrameHeader::control(FrameKind::Abort, me, text.len()).encode();
        let desc = N::local(&self.stage.mr);
        let mut sent = false;
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            let Some(addr) = p.addr else {
                continue;
            };
            let gone =
                p.closed || p.broken || p.local_pid.is_some_and(|pid| !crate::shm::pid_alive(pid));
            if gone {
                continue;
            }
            let Some(s) = self.stage.free.pop() else {
                break;
            };
            let at = s * self.stage.each;
            self.stage.bytes[at..at + HEADER_LEN].copy_from_slice(&h);
            self.stage.bytes[at + HEADER_LEN..at + HEADER_LEN + text.len()].copy_from_slice(text);
            self.stage_meta[s] = (p.rank, FrameKind::Abort, None);
            let ptr = self.stage.ptr(s);
            // SAFETY: the staging buffer stays ours until its completion,
            // and the pool outlives the endpoint.
            let r = unsafe {
                self.nic.send(
                    ptr,
                    HEADER_LEN + text.len(),
                    desc,
                    addr,
                    Ctx::Stage(s).encode(),
                )
            };
            if r.is_ok() {
                sent = true;
            } else {
                self.stage.free.push(s);
            }
        }
        let deadline = Instant::now() + Duration::from_millis(if sent { 50 } else { 0 });
        while Instant::now() < deadline {
            let mut comps = std::mem::take(&mut self.comps);
            let _ = self.nic.poll(&mut comps);
            self.comps = comps;
        }
        self.imms.clear();
        for p in &mut self.peers {
            p.out.clear();
            p.big.clear();
            p.one_sided.clear();
            p.core.clear();
            p.tx.clear();
        }
        self.grants.clear();
        self.aborted = true;
    }
}
