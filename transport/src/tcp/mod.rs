//! The TCP backend: non-blocking sockets on mio, driven by the engine thread.
//!
//! One listener per rank; the lower rank of each pair dials, the higher rank
//! accepts, so that exactly one connection of `lanes` sockets joins a pair no
//! matter which side asks first. Each socket opens with a [`lane::Hello`]
//! naming the dialer's rank and carrying a key derived from the job token;
//! until it has, a connection is a stranger, and `listen` bounds what
//! strangers may hold.
//! Messages are cut into segments of `segment_bytes`; segments are spread
//! over the lanes so that several sockets fill a link one socket cannot.
//!
//! Flow control is the receive core's (`recv_core`): a message goes eagerly
//! while the sender holds a credit per frame (one of the receiver's
//! `eager_frames` buffers, allocated when the connection is made), and is
//! announced (`Rts`) and sent once its receive is posted (`Cts`) otherwise.
//! A message of at most `SMALL_FRAME_BYTES` goes on one of the receiver's
//! small credits instead (`small_frames` small buffers), or is announced.
//! Credits come back on any frame going the other way, or in a `Credit`
//! frame, which alone carries small credits back (in its `offset`). Every
//! frame that arrives therefore has somewhere to go, so a lane is always
//! read to the end: no frame waits behind one nobody asked for.
//! Control frames (`Rts`, `Cts`, `Credit`) go on lane 0, ahead of data not
//! yet started.
//!
//! A small message can also skip the request table: `send_now` writes it
//! from the caller's thread when it has a credit and lane 0 nothing
//! queued, and `recv_now` takes one that a read left whole in the lane's
//! stage when nothing else is pending with the peer. Both keep the credit
//! accounting of the posted path; `recv_now` also returns credits in a
//! `Credit` frame once half are owed, as a progress pass would, since its
//! callers may run none.
//!
//! One-sided transfers are emulated over the same streams: a write is a
//! `Put` frame whose payload the receiver stores into its published region,
//! and a read is a `Get` frame that the region's owner answers, from its
//! own progress, with a `Fetched` frame of the bytes (what an RDMA READ
//! does without the owner's CPU, libfabric's tcp provider also does on it).

mod iface;
mod lane;
mod listen;

pub use iface::{choose_bind_ip, interface_addrs};
pub use listen::AcceptLimits;

use crate::error::{Error, Result};
use crate::recv_core::{
    Credits, DEFAULT_EAGER_FRAMES, DEFAULT_SMALL_FRAMES, Posted, Posting, RecvCore,
    SMALL_FRAME_BYTES,
};
use crate::reqmap::ReqTable;
use crate::seam::{
    Arrival, MemHandle, MemPtr, Now, Properties, Rank, ReadFrom, Readiness, RemoteRegion, Request,
    SendHint, Tag, Tested, Transport, TransportId, WriteImm,
};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};
use gw_rendezvous::PeerInfo;
use gw_rendezvous::nosignal;
use gw_rendezvous::peers::Eager;
use lane::{HELLO_LEN, Hello, Lane, OutSeg, Rx, Stage};
use listen::{Hailed, Listener};
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};

/// Messages up to this size travel on lane 0 (see `poke`): what one read
/// into the lane's stage takes whole.
const SMALL: usize = lane::STAGE_LEN - HEADER_LEN;

/// Frames written by one `sendmsg` at most (see `send_lane`).
const BATCH: usize = 16;

/// How often `poke` has every lane read even when only small messages are
/// expected.
const SWEEP_EVERY: u32 = 16;

/// Largest abort reason accepted from a peer.
const MAX_ABORT_TEXT: u64 = 64 * 1024;

/// Settings of the TCP backend.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Sockets per peer.
    pub lanes: usize,
    /// Largest payload per frame.
    pub segment_bytes: usize,
    /// Interface to listen on (`GW_SOCKET_IFNAME`); automatic when `None`.
    pub ifname: Option<String>,
    /// Address of the rendezvous store, used to choose the interface automatically.
    pub store_ip: Option<IpAddr>,
    /// Shared by the ranks of one job; stray connections without it are refused.
    pub job_key: u64,
    /// Send buffer of every socket (`SO_SNDBUF`; the kernel doubles it and
    /// caps it at `net.core.wmem_max`); 0 leaves it to the kernel's
    /// autotuning.
    pub send_buffer_bytes: usize,
    /// Receive buffer of every socket (`SO_RCVBUF`, doubled and capped at
    /// `net.core.rmem_max`); 0 leaves it to the kernel's autotuning.
    pub recv_buffer_bytes: usize,
    /// Frames of each peer buffered ahead of their receives, each up to
    /// `segment_bytes` (`GW_EAGER_FRAMES`): the credits a peer's sender
    /// gets. 0 announces every message.
    pub eager_frames: usize,
    /// Small buffers of each peer (`GW_EAGER_SMALL`), for messages of at
    /// most [`SMALL_FRAME_BYTES`]: the small credits a peer's sender gets,
    /// spent on those messages only, so that a run of small messages (a
    /// broadcast's root) need not wait for frame credits to come back.
    /// None where `eager_frames` is 0.
    pub small_frames: usize,
}

/// Default of [`TcpConfig::segment_bytes`], and of collectives over TCP
/// (`gw_collectives::config::TCP_SEGMENT_BYTES`, which says why 1 MiB).
pub const DEFAULT_SEGMENT_BYTES: usize = 1 << 20;

/// Default of [`TcpConfig::recv_buffer_bytes`]. The kernel's autotuning
/// starts a socket at 128 KiB to receive and grows it as a stream runs; a
/// collective's bursts of a few hundred KiB to a few MiB then stall on a
/// full buffer and move in pieces. Interleaved against autotuning on the
/// 2-core VM, 2 ranks: 1 MiB all-reduce 276 -> 229 us (every round), 64 KiB
/// 30.3 -> 27.1 us, 16 MiB 9.14 -> 8.75 ms. Buffer memory is only taken
/// while data waits in it.
pub const DEFAULT_RECV_BUFFER_BYTES: usize = 2 << 20;

/// Default of [`TcpConfig::send_buffer_bytes`]: a quarter of the receive
/// buffer, because a send buffer of several MiB (as autotuning grows it,
/// or as 2 MiB requested) lets a sender run megabytes ahead of its
/// receiver, and once a socket has carried such bursts its later 256 KiB-
/// 1 MiB messages stay 1.3-1.5x slower for the rest of its life
/// (docs/performance.md, "TCP send buffers"). At 512 KiB (1 MiB after the
/// kernel doubles it) that state never forms; 256 KiB avoided it too but
/// streamed 1 MiB point-to-point messages 0.75x as fast.
pub const DEFAULT_SEND_BUFFER_BYTES: usize = 512 << 10;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            lanes: 2,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            ifname: None,
            store_ip: None,
            job_key: 0,
            send_buffer_bytes: DEFAULT_SEND_BUFFER_BYTES,
            recv_buffer_bytes: DEFAULT_RECV_BUFFER_BYTES,
            eager_frames: DEFAULT_EAGER_FRAMES,
            small_frames: DEFAULT_SMALL_FRAMES,
        }
    }
}

enum ReqState {
    Send { segments_left: usize },
    Recv,
    Done,
}

/// The request number of frames that belong to no request (control frames).
const CONTROL: u64 = 0;

/// The request number of a message's frame that no request waits for: the
/// rest of a message the caller wrote at once (`send_now`). Request
/// numbers count up from 1 and never reach it.
const AT_ONCE: u64 = u64::MAX;

/// A one-sided read of ours in flight: where its bytes go.
struct PendingRead {
    peer: Rank,
    dst: MemPtr,
    len: usize,
}

/// A message of ours announced to its receiver, waiting for its `Cts`.
struct Announced {
    id: u64,
    req: u64,
    tag: Tag,
    base: MemPtr,
    len: usize,
}

/// A dialing socket that has not finished its hello yet.
struct Dial {
    sock: TcpStream,
    hello: [u8; HELLO_LEN],
    written: usize,
}

struct Conn {
    addr: String,
    lanes: Vec<Option<Lane>>,
    dials: Vec<Option<Dial>>,
    /// What arrives from the peer: posted receives, early frames,
    /// announcements, credits owed back.
    core: RecvCore<()>,
    /// Eager frames we may still send the peer ahead of their receives.
    credits: Credits,
    /// The largest eager frame the peer buffers.
    peer_frame_bytes: usize,
    /// Small messages we may still send the peer ahead of their receives,
    /// and the largest that is one (0: the peer has no small buffers).
    small_credits: Credits,
    peer_small_bytes: usize,
    /// Our announced messages waiting for their `Cts`.
    announced: VecDeque<Announced>,
    next_announce: u64,
    next_lane: usize,
    /// A control frame to the peer found its socket closed while nothing
    /// of ours was going its way: it finished and left. Nothing is written
    /// to it again; what it sent before leaving is still read.
    gone: bool,
}

impl Conn {
    /// Whether a message of `len` bytes goes on one of the peer's small
    /// credits rather than a frame credit (the peer tells the class from
    /// the size alone).
    fn fits_small(&self, len: usize) -> bool {
        self.peer_small_bytes > 0 && len <= self.peer_small_bytes
    }

    fn ready(&self) -> bool {
        self.lanes.iter().all(Option::is_some)
    }

    /// Whether every frame queued to the peer is a control frame: no
    /// message of ours is on its way to it or announced to it.
    fn only_control_queued(&self) -> bool {
        self.announced.is_empty()
            && self
                .lanes
                .iter()
                .flatten()
                .all(|l| l.sendq.iter().all(|s| s.req == CONTROL))
    }

    /// Refuses a message to a peer that has left (see `gone`).
    fn check_sendable(&self, peer: Rank) -> Result<()> {
        if self.gone {
            return Err(Error::Remote {
                rank: peer,
                addr: self.addr.clone(),
                what: "closed its connection earlier (it finished or exited): nothing more can be sent to it".into(),
            });
        }
        Ok(())
    }
}

/// The TCP transport (see the module comment).
pub struct TcpTransport {
    /// Issues this transport's memory handles and requests.
    id: TransportId,
    me: Rank,
    cfg: TcpConfig,
    listener: Listener,
    peers: Vec<PeerInfo>,
    conns: HashMap<Rank, Conn>,
    mems: Vec<Option<(MemPtr, usize)>>,
    /// Per registration slot: how many times it was handed out, so that a
    /// peer's write into a slot registered anew since is refused.
    mem_gens: Vec<u16>,
    free_mems: Vec<u32>,
    /// Immediates of peers' one-sided writes (`FrameKind::Put`), not taken.
    imms: VecDeque<Arrival>,
    /// This rank's one-sided reads waiting for their `Fetched` frame, by
    /// request id (the id the `Get` carried).
    reads: HashMap<u64, PendingRead>,
    reqs: ReqTable<ReqState>,
    next_req: u64,
    registry: Option<Registry>,
    token_base: usize,
    /// token offset -> (peer, lane); offset 0 is the listener.
    tokens: HashMap<usize, (Rank, usize)>,
    next_token: usize,
    /// Set by `abort`: no registered memory is touched again.
    aborted: bool,
    /// Calls of `poke`, for its sweeps.
    pokes: u32,
    /// A region of ours was handed to peers for one-sided access (see
    /// `poke`).
    published: bool,
    /// Frames read into a buffer because their receive was not posted.
    early_frames: u64,
    /// Rests of messages written at once (`send_now`) still queued, as of
    /// the last look (see `Transport::unsent`).
    at_once_queued: usize,
}

impl TcpTransport {
    /// Binds the listener. Call [`TcpTransport::set_peers`] once every rank's
    /// address is known.
    pub fn new(me: Rank, cfg: TcpConfig) -> Result<TcpTransport> {
        if cfg.lanes == 0 || cfg.lanes > 64 {
            return Err(Error::Config(format!(
                "lanes must be 1..=64, got {}",
                cfg.lanes
            )));
        }
        if cfg.segment_bytes == 0 || cfg.segment_bytes > u32::MAX as usize {
            return Err(Error::Config(format!(
                "segment size must be 1..=4294967295 bytes, got {}",
                cfg.segment_bytes
            )));
        }
        let (ip, why) = choose_bind_ip(cfg.ifname.as_deref(), cfg.store_ip)?;
        let listener = Listener::bind(SocketAddr::new(ip, 0))?;
        tracing::info!(
            "tcp: listening on {} ({why}), {} lane(s)",
            listener.addr(),
            cfg.lanes
        );
        Ok(TcpTransport {
            id: TransportId::next(),
            me,
            cfg,
            listener,
            peers: Vec::new(),
            conns: HashMap::new(),
            mems: Vec::new(),
            mem_gens: Vec::new(),
            free_mems: Vec::new(),
            imms: VecDeque::with_capacity(crate::seam::REQS_RESERVED),
            reads: HashMap::new(),
            // Reserved: a table that grows when more requests than ever are
            // live at once would allocate in a steady-state step (hashbrown
            // rehashes in place while at most half full).
            reqs: ReqTable::with_capacity(crate::seam::REQS_RESERVED),
            next_req: 1,
            registry: None,
            token_base: 0,
            tokens: HashMap::new(),
            next_token: 1,
            aborted: false,
            pokes: 0,
            published: false,
            early_frames: 0,
            at_once_queued: 0,
        })
    }

    /// The address peers dial.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listener.addr()
    }

    /// Bounds what connections that have not sent their hello may hold
    /// (see [`AcceptLimits`]); refuses a limit of 0 for either.
    pub fn set_accept_limits(&mut self, limits: AcceptLimits) -> Result<()> {
        self.listener.set_limits(limits)
    }

    /// Accepted connections waiting for their hello now.
    pub fn waiting_connections(&self) -> usize {
        self.listener.waiting()
    }

    /// Frames that came in before their receive was posted, and were read
    /// into a buffer and copied again later, since this transport was made.
    pub fn early_frames(&self) -> u64 {
        self.early_frames
    }

    /// Frames of peers held in early buffers now, and the buffers there are
    /// (`eager_frames` per connected peer): the first never exceeds the
    /// second.
    pub fn early_buffered(&self) -> (usize, usize) {
        self.conns.values().fold((0, 0), |(n, cap), c| {
            (n + c.core.buffered(), cap + c.core.buffers())
        })
    }

    /// Every rank's bring-up record, indexed by rank.
    pub fn set_peers(&mut self, peers: Vec<PeerInfo>) {
        self.peers = peers;
    }

    fn peer_addr(&self, peer: Rank) -> String {
        match self.peers.get(peer as usize) {
            Some(p) => match p.tcp.first() {
                Some(a) => format!("{} on {}", a, p.hostname),
                None => p.hostname.clone(),
            },
            None => "unknown address".into(),
        }
    }

    fn new_req(&mut self, st: ReqState) -> u64 {
        let id = self.next_req;
        self.next_req += 1;
        self.reqs.post(id, st);
        id
    }

    fn mem(&self, mem: MemHandle, offset: usize, len: usize) -> Result<MemPtr> {
        let index = mem.index_for(self.id, "tcp")?;
        let (ptr, size) = self
            .mems
            .get(index as usize)
            .and_then(|m| *m)
            .ok_or_else(|| {
                Error::InvalidUsage(format!("memory handle {index} is not registered"))
            })?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!(
                "range [{offset}, +{len}) exceeds the {size}-byte registered region"
            )));
        }
        // SAFETY: offset + len lies within the registered region.
        Ok(MemPtr(unsafe { ptr.0.add(offset) }))
    }

    fn register_sock(&mut self, sock: &mut TcpStream, peer: Rank, lane: usize) -> Result<()> {
        if let Some(reg) = &self.registry {
            let off = self.next_token;
            self.next_token += 1;
            reg.register(
                sock,
                Token(self.token_base + off),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| {
                Error::sys("epoll_ctl", format!("registering socket to rank {peer}"), e)
            })?;
            self.tokens.insert(off, (peer, lane));
        }
        Ok(())
    }

    /// Checks, before any request exists, that a transfer with `peer` may be
    /// posted now.
    fn check_post(&self, peer: Rank, what: &str) -> Result<()> {
        if self.aborted {
            return Err(Error::Aborted("the TCP transport was aborted".into()));
        }
        if !self.conns.get(&peer).is_some_and(Conn::ready) {
            return Err(Error::InvalidUsage(format!(
                "{what} rank {peer} before its connection is ready"
            )));
        }
        Ok(())
    }

    /// As [`TcpTransport::check_post`], for a message to `peer`.
    fn check_send(&self, peer: Rank, what: &str) -> Result<()> {
        self.check_post(peer, what)?;
        match self.conns.get(&peer) {
            Some(c) => c.check_sendable(peer),
            None => Err(vanished(peer)),
        }
    }

    /// What this rank buffers of each TCP peer's early frames, for its
    /// published record ([`PeerInfo::tcp_eager`]).
    pub fn eager(&self) -> Eager {
        let (small_frames, small_bytes) = self.small();
        Eager {
            frames: self.cfg.eager_frames as u32,
            frame_bytes: self.cfg.segment_bytes as u32,
            small_frames: small_frames as u32,
            small_bytes: small_bytes as u32,
        }
    }

    /// The small buffers this rank keeps per peer, and their size.
    fn small(&self) -> (usize, usize) {
        let bytes = SMALL_FRAME_BYTES.min(self.cfg.segment_bytes);
        if self.cfg.eager_frames == 0 || self.cfg.small_frames == 0 || bytes == 0 {
            (0, 0)
        } else {
            (self.cfg.small_frames, bytes)
        }
    }

    fn conn_entry(&mut self, peer: Rank) -> &mut Conn {
        let lanes = self.cfg.lanes;
        let (me, seg, eager_frames) = (self.me, self.cfg.segment_bytes, self.cfg.eager_frames);
        let (small_frames, small_bytes) = self.small();
        let addr = self.peer_addr(peer);
        let theirs = self
            .peers
            .get(peer as usize)
            .map(|p| p.tcp_eager)
            .unwrap_or_default();
        self.conns.entry(peer).or_insert_with(|| Conn {
            addr,
            lanes: (0..lanes).map(|_| None).collect(),
            dials: (0..lanes).map(|_| None).collect(),
            core: RecvCore::with_small(me, peer, eager_frames, seg, small_frames, small_bytes),
            credits: Credits::new(theirs.frames as usize),
            peer_frame_bytes: theirs.frame_bytes as usize,
            small_credits: Credits::new(theirs.small_frames as usize),
            peer_small_bytes: if theirs.small_frames > 0 {
                theirs.small_bytes as usize
            } else {
                0
            },
            announced: VecDeque::with_capacity(crate::seam::POSTED_RESERVED),
            next_announce: 0,
            next_lane: 0,
            gone: false,
        })
    }

    fn start_dial(&mut self, peer: Rank) -> Result<()> {
        let info = self.peers.get(peer as usize).ok_or_else(|| {
            Error::InvalidArgument(format!("rank {peer} is not in this communicator"))
        })?;
        let target = *info.tcp.first().ok_or_else(|| {
            Error::Config(format!(
                "rank {peer} published no TCP address (is it using GW_TRANSPORT=shm?)"
            ))
        })?;
        let nlanes = self.cfg.lanes;
        let me = self.me;
        let key = self.cfg.job_key;
        for lane in 0..nlanes {
            let sock = TcpStream::connect(target).map_err(|e| {
                Error::sys(
                    "connect",
                    format!("rank {me} to rank {peer} at {target}"),
                    e,
                )
            })?;
            let hello = Hello {
                rank: me,
                lane: lane as u32,
                nlanes: nlanes as u32,
                job_key: key,
            }
            .encode();
            self.conn_entry(peer).dials[lane] = Some(Dial {
                sock,
                hello,
                written: 0,
            });
        }
        tracing::info!("tcp: dialing rank {peer} at {target} with {nlanes} lane(s)");
        Ok(())
    }

    /// Advances dialing sockets; a dial becomes a lane once its hello is written.
    fn progress_dials(&mut self) -> Result<bool> {
        let mut moved = false;
        let me = self.me;
        let peers: Vec<Rank> = self
            .conns
            .iter()
            .filter(|(_, c)| c.dials.iter().any(Option::is_some))
            .map(|(p, _)| *p)
            .collect();
        for peer in peers {
            for lane in 0..self.cfg.lanes {
                let Some(conn) = self.conns.get_mut(&peer) else {
                    continue;
                };
                let addr = conn.addr.clone();
                let Some(d) = conn.dials[lane].as_mut() else {
                    continue;
                };
                if let Some(e) = d.sock.take_error().ok().flatten() {
                    return Err(Error::sys(
                        "connect",
                        format!("rank {me} to rank {peer} at {addr}"),
                        e,
                    ));
                }
                match nosignal::send(&d.sock, &d.hello[d.written..]) {
                    Ok(n) => d.written += n,
                    Err(e) if would_block(&e) || e.kind() == io::ErrorKind::NotConnected => {
                        continue;
                    }
                    Err(e) => {
                        return Err(Error::sys(
                            "connect",
                            format!("rank {me} to rank {peer} at {addr}"),
                            e,
                        ));
                    }
                }
                if d.written == HELLO_LEN {
                    let Some(d) = conn.dials[lane].take() else {
                        continue;
                    };
                    let mut sock = d.sock;
                    size_buffers(&sock, &self.cfg, peer);
                    sock.set_nodelay(true).map_err(|e| {
                        Error::sys("setsockopt(TCP_NODELAY)", format!("to rank {peer}"), e)
                    })?;
                    self.register_sock(&mut sock, peer, lane)?;
                    if let Some(conn) = self.conns.get_mut(&peer) {
                        conn.lanes[lane] = Some(Lane::new(sock));
                    }
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    /// Accepts sockets and admits those whose hello came in.
    fn progress_accepts(&mut self) -> Result<bool> {
        // While a peer is still to connect, its connection is looked for on
        // every call, as a caller driving its own operation reads no poller
        // events (the engine thread, which would, is parked meanwhile).
        let connecting = self.conns.values().any(|c| !c.ready());
        let mut hailed = Vec::new();
        let moved = self
            .listener
            .progress(&mut hailed, self.registry.is_none() || connecting)?;
        for h in hailed {
            self.admit(h)?;
        }
        Ok(moved)
    }

    fn admit(&mut self, inc: Hailed) -> Result<()> {
        let Some(h) = Hello::decode(&inc.hello) else {
            tracing::warn!(
                "tcp: refused connection from {}: not a gradwire hello",
                inc.addr
            );
            return Ok(());
        };
        if h.job_key != self.cfg.job_key {
            tracing::warn!(
                "tcp: refused connection from {}: wrong job key (another job?)",
                inc.addr
            );
            return Ok(());
        }
        let world = self.peers.len() as u32;
        if h.rank >= self.me
            || h.rank >= world
            || h.nlanes as usize != self.cfg.lanes
            || h.lane >= h.nlanes
        {
            tracing::warn!(
                "tcp: refused connection from {} claiming rank {} lane {}/{}: this rank {} expects rank < {} and {} lane(s) (is GW_LANES the same on every rank?)",
                inc.addr,
                h.rank,
                h.lane,
                h.nlanes,
                self.me,
                self.me,
                self.cfg.lanes
            );
            return Ok(());
        }
        let (peer, lane) = (h.rank, h.lane as usize);
        if self
            .conns
            .get(&peer)
            .is_some_and(|c| c.lanes[lane].is_some())
        {
            return Err(Error::Remote {
                rank: peer,
                addr: inc.addr.to_string(),
                what: format!("connected lane {lane} twice: is rank {peer} running twice?"),
            });
        }
        let mut sock = inc.sock;
        size_buffers(&sock, &self.cfg, peer);
        sock.set_nodelay(true)
            .map_err(|e| Error::sys("setsockopt(TCP_NODELAY)", format!("from rank {peer}"), e))?;
        self.register_sock(&mut sock, peer, lane)?;
        self.conn_entry(peer).lanes[lane] = Some(Lane::new(sock));
        tracing::trace!("tcp: accepted lane {lane} from rank {peer} ({})", inc.addr);
        Ok(())
    }

    /// Queues the frames of a message (`len` bytes at `base`) to the peer
    /// of `conn`, in segments of `seg` bytes spread over its lanes.
    #[allow(clippy::too_many_arguments)]
    fn queue_message(
        conn: &mut Conn,
        me: Rank,
        seg: usize,
        tag: Tag,
        base: MemPtr,
        len: usize,
        req: u64,
        cleared: bool,
    ) {
        let nseg = len.div_ceil(seg).max(1);
        let nl = conn.lanes.len();
        for s in 0..nseg {
            let off = s * seg;
            let this = (len - off).min(seg);
            let hdr = FrameHeader {
                kind: FrameKind::Data,
                cleared,
                credits: 0,
                src_rank: me,
                tag,
                offset: off as u64,
                len: this as u64,
                total: len as u64,
            };
            // Small messages all take lane 0, where a caller spinning on a
            // small operation looks first (see `poke`); larger ones spread.
            let li = if len <= SMALL {
                0
            } else {
                conn.next_lane = conn.next_lane.wrapping_add(1);
                conn.next_lane % nl
            };
            if let Some(lane) = conn.lanes[li].as_mut() {
                lane.sendq.push_back(OutSeg {
                    req,
                    hdr: hdr.encode(),
                    // SAFETY: off + this <= len, within the caller's range.
                    ptr: MemPtr(unsafe { base.0.add(off) }),
                    len: this,
                    done: 0,
                    stamped: false,
                    keep: None,
                });
            }
        }
    }

    /// Queues a header-only control frame on lane 0, ahead of every frame
    /// not yet started: an announcement, a clearance or credits should not
    /// wait behind megabytes of data.
    fn queue_control(conn: &mut Conn, hdr: FrameHeader) {
        if conn.gone {
            return;
        }
        let Some(lane) = conn.lanes[0].as_mut() else {
            return;
        };
        let at = usize::from(lane.sendq.front().is_some_and(|s| s.done > 0));
        lane.sendq.insert(
            at,
            OutSeg {
                req: CONTROL,
                hdr: hdr.encode(),
                ptr: MemPtr(std::ptr::null_mut()),
                len: 0,
                done: 0,
                stamped: false,
                keep: None,
            },
        );
    }

    /// A control frame of `kind` from this rank.
    fn control(&self, kind: FrameKind) -> FrameHeader {
        FrameHeader::control(kind, self.me, 0)
    }

    /// Takes the credit a message of `len` bytes to `peer` needs to be
    /// written at once, as `isend` would (a small credit for what fits the
    /// peer's small buffers, a frame credit otherwise), and says which
    /// (`true`: small); `None`, and nothing taken, if there is none or lane
    /// 0 cannot be written now (it has frames queued, which the message
    /// must not overtake, or the socket said it was full).
    fn take_send_credit(&mut self, peer: Rank, len: usize) -> Option<bool> {
        let always = self.registry.is_none();
        let seg = self.cfg.segment_bytes;
        let conn = self.conns.get_mut(&peer)?;
        let lane = conn.lanes[0].as_ref()?;
        if !lane.sendq.is_empty() || !(lane.writable || always) {
            return None;
        }
        let small = conn.fits_small(len);
        let taken = if small {
            conn.small_credits.take(1)
        } else {
            seg <= conn.peer_frame_bytes && conn.credits.take(1)
        };
        taken.then_some(small)
    }

    /// Reads what `peer` has sent on lane 0 (credits, clearances, frames),
    /// as a progress pass would.
    fn read_peer(&mut self, peer: Rank) -> Result<()> {
        if let Some(lane) = self.conns.get_mut(&peer).and_then(|c| c.lanes[0].as_mut()) {
            lane.mark_readable();
        }
        self.progress_recvs().map(drop)
    }

    fn complete_send_segment(reqs: &mut ReqTable<ReqState>, req: u64) {
        if let Some(ReqState::Send { segments_left }) = reqs.get_mut(&req) {
            *segments_left -= 1;
            if *segments_left == 0 {
                reqs.finish(req, ReqState::Done);
            }
        }
    }

    /// Writes queued segments on every writable lane. Credits owed to a
    /// peer ride on the next frame that starts to it; when nothing is going
    /// its way and half its credits are owed, a `Credit` frame takes them.
    fn progress_sends(&mut self) -> Result<bool> {
        let mut moved = false;
        let always = self.registry.is_none();
        let credit = self.control(FrameKind::Credit);
        for (&peer, conn) in self.conns.iter_mut() {
            if conn.gone {
                continue;
            }
            if credits_due(&conn.core) && conn.lanes[0].as_ref().is_some_and(|l| l.sendq.is_empty())
            {
                // Frame credits are stamped on as it starts, as on every
                // frame; small ones ride only here, in its `offset`.
                let small = conn.core.take_owed_small(1);
                Self::queue_control(
                    conn,
                    FrameHeader {
                        offset: u64::from(small),
                        ..credit
                    },
                );
            }
            for li in 0..conn.lanes.len() {
                let Conn { lanes, core, .. } = &mut *conn;
                let Some(lane) = lanes[li].as_mut() else {
                    continue;
                };
                match Self::send_lane(lane, core, &mut self.reqs, always) {
                    Ok(m) => moved |= m,
                    Err(e) if severed(&e) && conn.only_control_queued() => {
                        // The peer finished and closed while we still owed
                        // it credits (or a clearance it no longer needs):
                        // nothing of ours is lost, so nothing fails here.
                        // Whatever is posted to it later fails instead.
                        tracing::info!(
                            "tcp: rank {peer} ({}) has closed its connection ({e}); nothing was going its way, so this rank carries on",
                            conn.addr
                        );
                        conn.gone = true;
                        for lane in conn.lanes.iter_mut().flatten() {
                            lane.sendq.clear();
                        }
                        moved = true;
                        break;
                    }
                    Err(e) => return Err(peer_io_error(peer, &conn.addr, "sending", e)),
                }
            }
        }
        if self.at_once_queued > 0 {
            self.at_once_queued = self
                .conns
                .values()
                .flat_map(|c| c.lanes.iter().flatten())
                .map(|l| l.sendq.iter().filter(|s| s.req == AT_ONCE).count())
                .sum();
        }
        Ok(moved)
    }

    /// Writes what `lane` has queued while the socket takes it, up to
    /// [`BATCH`] frames per `sendmsg`: a receiver clearing a window of
    /// announced messages queues a `Cts` for each, and a stream of small
    /// messages a frame each, which one call per frame made a system call
    /// per message on both sides. A write that takes nothing is
    /// `ErrorKind::WriteZero`.
    fn send_lane(
        lane: &mut Lane,
        core: &mut RecvCore<()>,
        reqs: &mut ReqTable<ReqState>,
        always: bool,
    ) -> io::Result<bool> {
        let mut moved = false;
        while (lane.writable || always) && !lane.sendq.is_empty() {
            let mut iov = [IoSlice::new(&[]); 2 * BATCH];
            let mut k = 0;
            for seg in lane.sendq.iter_mut().take(BATCH) {
                if !seg.stamped {
                    // Once: a write that took nothing leaves the frame
                    // (and the credits it carries) queued.
                    seg.stamped = true;
                    let n = core.take_owed(1);
                    if n > 0 {
                        seg.hdr[6..8].copy_from_slice(&n.to_le_bytes());
                    }
                }
            }
            for seg in lane.sendq.iter().take(BATCH) {
                if seg.done < HEADER_LEN {
                    iov[k] = IoSlice::new(&seg.hdr[seg.done..]);
                    k += 1;
                }
                let from = seg.done.saturating_sub(HEADER_LEN);
                if seg.len > from {
                    iov[k] = IoSlice::new(match &seg.keep {
                        Some(keep) => &keep[from..],
                        // SAFETY: the segment lies in registered memory that
                        // outlives the send; from < len (a zero-length
                        // message, which may carry a null pointer, has no
                        // payload slice).
                        None => unsafe {
                            std::slice::from_raw_parts(seg.ptr.0.add(from), seg.len - from)
                        },
                    });
                    k += 1;
                }
            }
            match nosignal::send_vectored(&lane.sock, &iov[..k]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the connection closed",
                    ));
                }
                Ok(mut n) => {
                    moved = true;
                    while n > 0 {
                        let Some(seg) = lane.sendq.front_mut() else {
                            break;
                        };
                        let left = HEADER_LEN + seg.len - seg.done;
                        if n < left {
                            seg.done += n;
                            break;
                        }
                        n -= left;
                        let req = seg.req;
                        lane.sendq.pop_front();
                        Self::complete_send_segment(reqs, req);
                    }
                }
                Err(e) if would_block(&e) => {
                    lane.writable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(moved)
    }

    /// Reads frames on every readable (or newly unstalled) lane.
    fn progress_recvs(&mut self) -> Result<bool> {
        let mut moved = false;
        let always = self.registry.is_none();
        let me = self.me;
        let cts = self.control(FrameKind::Cts);
        for (&peer, conn) in self.conns.iter_mut() {
            let seg = self.cfg.segment_bytes;
            let nlanes = conn.lanes.len();
            let mut closed_lanes = conn.lanes.iter().flatten().filter(|l| l.closed).count();
            for li in 0..nlanes {
                loop {
                    let Conn {
                        lanes,
                        core,
                        addr,
                        credits,
                        ..
                    } = &mut *conn;
                    let Some(lane) = lanes[li].as_mut() else {
                        break;
                    };
                    match &mut lane.rx {
                        Rx::Parked { hdr } => {
                            let hdr = *hdr;
                            lane.rx = match core.find(&hdr)? {
                                Some(i) => start_payload(hdr, &core.posted()[i]),
                                None => {
                                    self.early_frames += 1;
                                    let (buf, _) = core.early_buffer(&hdr)?;
                                    Rx::Early { hdr, buf, got: 0 }
                                }
                            };
                            moved = true;
                        }
                        Rx::Early { hdr, buf, got } => {
                            let (hdr, b) = (*hdr, *buf);
                            let n = hdr.len as usize;
                            if *got < n {
                                if !(lane.readable || always || lane.stage.pending()) {
                                    break;
                                }
                                match read_some(
                                    &mut lane.sock,
                                    &mut lane.stage,
                                    &mut lane.readable,
                                    &mut core.early_bytes(b, n)[*got..],
                                    peer,
                                    addr,
                                )? {
                                    Some(k) => {
                                        moved = true;
                                        *got += k;
                                    }
                                    None => break,
                                }
                                continue;
                            }
                            lane.rx = Rx::new();
                            moved = true;
                            // The receive may have been posted while the
                            // payload was read: then it is delivered now.
                            if let Some(p) = core.file(hdr, b)? {
                                self.reqs.finish(p.req, ReqState::Done);
                            }
                        }
                        Rx::Header { buf, got } => {
                            if lane.closed || !(lane.readable || always || lane.stage.pending()) {
                                break;
                            }
                            if !always && lane.stage.drained && !lane.stage.pending() {
                                // The last read came back short: the socket
                                // was empty then, and no event or poke since
                                // said otherwise, so a read now would only
                                // return EAGAIN. A run of early frames (a
                                // broadcast root running ahead) cost one such
                                // read each.
                                lane.readable = false;
                                break;
                            }
                            match lane.stage.read(&mut lane.sock, &mut buf[*got..]) {
                                Ok(0) => return Err(closed(peer, addr, *got > 0)),
                                Ok(n) => {
                                    moved = true;
                                    *got += n;
                                    if *got < HEADER_LEN {
                                        continue;
                                    }
                                    let hdr =
                                        FrameHeader::decode(buf).map_err(|e| Error::Remote {
                                            rank: peer,
                                            addr: addr.clone(),
                                            what: format!("sent a bad frame: {e}"),
                                        })?;
                                    // The next frame on this lane is likely of
                                    // this one's kind: pull ahead only after
                                    // small ones.
                                    lane.stage.ahead = hdr.len as usize <= SMALL;
                                    // Every frame may carry credits back (see
                                    // `send_lane`), the one-sided ones handled
                                    // here too: dropped, the peer would have to
                                    // announce every later message.
                                    if matches!(
                                        hdr.kind,
                                        FrameKind::Put | FrameKind::Get | FrameKind::Fetched
                                    ) && hdr.src_rank == peer
                                        && hdr.credits > 0
                                    {
                                        credits.give_back(hdr.credits, peer)?;
                                    }
                                    match hdr.kind {
                                        FrameKind::Close => {
                                            closed_lanes += 1;
                                            lane.closed = true;
                                            lane.rx = Rx::new();
                                            // Close is the last frame of every lane: once
                                            // all lanes carried it, everything the peer
                                            // sent is in.
                                            if closed_lanes == nlanes && !core.posted().is_empty() {
                                                return Err(Error::Remote {
                                                    rank: peer,
                                                    addr: addr.clone(),
                                                    what: "shut its communicator down while this rank still expected data from it".into(),
                                                });
                                            }
                                            break;
                                        }
                                        FrameKind::Abort => {
                                            if hdr.len > MAX_ABORT_TEXT {
                                                return Err(Error::Remote {
                                                    rank: peer,
                                                    addr: addr.clone(),
                                                    what: "aborted (reason too long to read)"
                                                        .into(),
                                                });
                                            }
                                            lane.rx = Rx::Abort {
                                                hdr,
                                                buf: Vec::with_capacity(hdr.len as usize),
                                            };
                                            continue;
                                        }
                                        FrameKind::Put => {
                                            let target = if hdr.src_rank == peer {
                                                put_target(&self.mems, &self.mem_gens, hdr)
                                            } else {
                                                Err(format!(
                                                    "sent a write claiming to be from rank {}",
                                                    hdr.src_rank
                                                ))
                                            };
                                            lane.rx = target.map_err(|what| Error::Remote {
                                                rank: peer,
                                                addr: addr.clone(),
                                                what,
                                            })?;
                                            continue;
                                        }
                                        FrameKind::Get => {
                                            let src = if hdr.src_rank == peer {
                                                region_range(
                                                    &self.mems,
                                                    &self.mem_gens,
                                                    (hdr.total >> 32) as u32,
                                                    hdr.offset,
                                                    hdr.tag.seq,
                                                    Access::Read,
                                                )
                                            } else {
                                                Err(format!(
                                                    "sent a read claiming to be from rank {}",
                                                    hdr.src_rank
                                                ))
                                            };
                                            let ptr = src.map_err(|what| Error::Remote {
                                                rank: peer,
                                                addr: addr.clone(),
                                                what,
                                            })?;
                                            lane.rx = Rx::new();
                                            // Served from this rank's progress, behind
                                            // what the lane already carries.
                                            let reply = FrameHeader {
                                                offset: hdr.tag.comm,
                                                len: hdr.tag.seq,
                                                ..FrameHeader::control(FrameKind::Fetched, me, 0)
                                            };
                                            lane.sendq.push_back(OutSeg {
                                                req: CONTROL,
                                                hdr: reply.encode(),
                                                ptr,
                                                len: hdr.tag.seq as usize,
                                                done: 0,
                                                stamped: false,
                                                keep: None,
                                            });
                                            moved = true;
                                            continue;
                                        }
                                        FrameKind::Fetched => {
                                            let id = hdr.offset;
                                            let target = match self.reads.get(&id) {
                                                Some(r)
                                                    if r.peer == peer
                                                        && r.len as u64 == hdr.len =>
                                                {
                                                    Ok(Rx::Fetched {
                                                        hdr,
                                                        req: id,
                                                        dst: r.dst,
                                                        got: 0,
                                                    })
                                                }
                                                Some(r) if r.peer == peer => Err(format!(
                                                    "answered read {id} with {} bytes where {} were asked for",
                                                    hdr.len, r.len
                                                )),
                                                _ => Err(format!(
                                                    "sent the bytes of read {id}, which this rank never asked it for"
                                                )),
                                            };
                                            lane.rx = target.map_err(|what| Error::Remote {
                                                rank: peer,
                                                addr: addr.clone(),
                                                what,
                                            })?;
                                            continue;
                                        }
                                        FrameKind::Rendezvous
                                        | FrameKind::Imm
                                        | FrameKind::Grant => {
                                            return Err(Error::Remote {
                                                rank: peer,
                                                addr: addr.clone(),
                                                what: format!(
                                                    "sent a {:?} frame, which TCP does not carry",
                                                    hdr.kind
                                                ),
                                            });
                                        }
                                        _ => {}
                                    }
                                    if hdr.src_rank != peer {
                                        return Err(Error::Remote {
                                            rank: peer,
                                            addr: addr.clone(),
                                            what: format!(
                                                "sent a frame claiming to be from rank {}",
                                                hdr.src_rank
                                            ),
                                        });
                                    }
                                    if hdr.credits > 0 {
                                        conn.credits.give_back(hdr.credits, peer)?;
                                    }
                                    if hdr.kind == FrameKind::Credit && hdr.offset > 0 {
                                        let n = u16::try_from(hdr.offset).map_err(|_| {
                                            Error::Protocol(format!(
                                                "rank {peer} returned {} small credits in one frame",
                                                hdr.offset
                                            ))
                                        })?;
                                        conn.small_credits.give_back(n, peer).map_err(
                                            |e| match e {
                                                Error::Protocol(s) => {
                                                    Error::Protocol(format!("{s} (small credits)"))
                                                }
                                                e => e,
                                            },
                                        )?;
                                    }
                                    let Conn {
                                        lanes,
                                        core,
                                        announced,
                                        ..
                                    } = &mut *conn;
                                    let Some(lane) = lanes[li].as_mut() else {
                                        break;
                                    };
                                    match hdr.kind {
                                        FrameKind::Credit => {
                                            lane.rx = Rx::new();
                                        }
                                        FrameKind::Rts => {
                                            lane.rx = Rx::new();
                                            if let Some((_, id, ())) = core.announce(hdr, ())? {
                                                Self::queue_control(
                                                    conn,
                                                    FrameHeader { offset: id, ..cts },
                                                );
                                            }
                                        }
                                        FrameKind::Cts => {
                                            lane.rx = Rx::new();
                                            let Some(k) =
                                                announced.iter().position(|a| a.id == hdr.offset)
                                            else {
                                                return Err(Error::Protocol(format!(
                                                    "rank {peer} cleared announcement {} that this rank never made",
                                                    hdr.offset
                                                )));
                                            };
                                            if let Some(a) = announced.remove(k) {
                                                Self::queue_message(
                                                    conn, me, seg, a.tag, a.base, a.len, a.req,
                                                    true,
                                                );
                                            }
                                        }
                                        _ => match core.find(&hdr)? {
                                            Some(i) => {
                                                lane.rx = start_payload(hdr, &core.posted()[i]);
                                            }
                                            None => {
                                                lane.rx = Rx::Parked { hdr };
                                                break;
                                            }
                                        },
                                    }
                                }
                                Err(e) if would_block(&e) => {
                                    lane.readable = false;
                                    break;
                                }
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                                Err(e) => return Err(peer_io_error(peer, addr, "receiving", e)),
                            }
                        }
                        Rx::Payload { hdr, dst, got, .. }
                        | Rx::Put { hdr, dst, got }
                        | Rx::Fetched { hdr, dst, got, .. }
                            if *got < hdr.len as usize =>
                        {
                            let len = hdr.len as usize;
                            if !(lane.readable || always || lane.stage.pending()) {
                                break;
                            }
                            // SAFETY: dst + [0, len) lies within a registered range:
                            // the posted receive's (checked when the header matched)
                            // or a published region's (checked by put_target).
                            let buf = unsafe {
                                std::slice::from_raw_parts_mut(dst.0.add(*got), len - *got)
                            };
                            match read_some(
                                &mut lane.sock,
                                &mut lane.stage,
                                &mut lane.readable,
                                buf,
                                peer,
                                addr,
                            )? {
                                Some(n) => {
                                    moved = true;
                                    *got += n;
                                }
                                None => break,
                            }
                        }
                        Rx::Payload { hdr, req, .. } => {
                            let (hdr, req) = (*hdr, *req);
                            let len = hdr.len as usize;
                            if let Some(i) = core.index_of(req)
                                && let Some(p) = core.delivered(i, &hdr, len)
                            {
                                self.reqs.finish(p.req, ReqState::Done);
                            }
                            lane.rx = Rx::new();
                            moved = true;
                            if lane.stage.drained && !lane.stage.pending() {
                                // Look again when told (poller, poke).
                                lane.readable = false;
                            }
                        }
                        Rx::Fetched { req, .. } => {
                            // The bytes are in: the read is done.
                            let req = *req;
                            self.reads.remove(&req);
                            self.reqs.finish(req, ReqState::Done);
                            lane.rx = Rx::new();
                            moved = true;
                        }
                        Rx::Put { hdr, .. } => {
                            // The bytes are in: the immediate may be taken.
                            self.imms.push_back(Arrival {
                                from: Some(peer),
                                imm: hdr.total as u32,
                            });
                            lane.rx = Rx::new();
                            moved = true;
                        }
                        Rx::Abort { hdr, buf } => {
                            let want = hdr.len as usize;
                            let mut chunk = [0u8; 4096];
                            let take = (want - buf.len()).min(chunk.len());
                            if take > 0 {
                                match lane.stage.read(&mut lane.sock, &mut chunk[..take]) {
                                    Ok(0) => {}
                                    Ok(n) => {
                                        buf.extend_from_slice(&chunk[..n]);
                                        continue;
                                    }
                                    Err(e) if would_block(&e) => {
                                        lane.readable = false;
                                        break;
                                    }
                                    Err(_) => {}
                                }
                            }
                            return Err(Error::Remote {
                                rank: peer,
                                addr: addr.clone(),
                                what: format!("aborted: {}", String::from_utf8_lossy(buf)),
                            });
                        }
                    }
                }
            }
        }
        Ok(moved)
    }
}

/// Whether half of the peer's frame credits or of its small credits are
/// owed to it: then a `Credit` frame takes them back when nothing else is
/// going its way.
fn credits_due(core: &RecvCore<()>) -> bool {
    let half = (core.credits() as u32).div_ceil(2).max(1);
    let half_small = (core.small_credits().0 as u32).div_ceil(2).max(1);
    core.owed() >= half || core.owed_small() >= half_small
}

/// A frame without an operation: abort reasons and clean-close notices.
fn control_header(kind: FrameKind, me: Rank, len: usize) -> [u8; HEADER_LEN] {
    FrameHeader::control(kind, me, len).encode()
}

/// Sets a lane's send and receive buffers as configured (0: left to the
/// kernel). A refusal costs speed, not correctness: it is logged, not fatal.
fn size_buffers(sock: &TcpStream, cfg: &TcpConfig, peer: Rank) {
    let s = socket2::SockRef::from(sock);
    let (snd, rcv) = (cfg.send_buffer_bytes, cfg.recv_buffer_bytes);
    for (what, bytes, res) in [
        (
            "SO_SNDBUF",
            snd,
            (snd > 0).then(|| s.set_send_buffer_size(snd)),
        ),
        (
            "SO_RCVBUF",
            rcv,
            (rcv > 0).then(|| s.set_recv_buffer_size(rcv)),
        ),
    ] {
        if let Some(Err(e)) = res {
            tracing::warn!(
                "tcp: setsockopt({what}) of {bytes} bytes on a socket to rank {peer}: {e}"
            );
        }
    }
}

/// The key a peer names registration slot `index` by: its generation in
/// the high half, so that a descriptor of a slot registered anew since is
/// told apart.
fn put_key(index: u32, generation: u16) -> Option<u32> {
    (index < 1 << 16).then_some((u32::from(generation) << 16) | index)
}

/// Where a `Put` frame's payload goes: the published region its key names,
/// at its offset, bounds-checked; the peer's error otherwise.
fn put_target(
    mems: &[Option<(MemPtr, usize)>],
    gens: &[u16],
    hdr: FrameHeader,
) -> std::result::Result<Rx, String> {
    let dst = region_range(
        mems,
        gens,
        (hdr.total >> 32) as u32,
        hdr.offset,
        hdr.len,
        Access::Write,
    )?;
    Ok(Rx::Put { hdr, dst, got: 0 })
}

/// The TCP key of `remote`, once `[off, +len)` of it is known to be a range
/// `peer` published; `verb` and `prep` word the refusal ("write_imm to"
/// rank 1 "into" a region rank 0 published). Nothing is formatted unless
/// it is refused: this runs on every one-sided transfer.
fn remote_key(
    peer: Rank,
    remote: &RemoteRegion,
    off: u64,
    len: usize,
    verb: &'static str,
    prep: &'static str,
) -> Result<u32> {
    let what = || format!("{verb} rank {peer}");
    if remote.rank != peer {
        return Err(Error::InvalidArgument(format!(
            "{} {prep} a region rank {} published",
            what(),
            remote.rank
        )));
    }
    if off
        .checked_add(len as u64)
        .is_none_or(|end| end > remote.len)
    {
        return Err(Error::InvalidArgument(format!(
            "{}: [{off}, +{len}) lies outside its published region of {} bytes",
            what(),
            remote.len
        )));
    }
    u32::try_from(remote.key).map_err(|_| {
        Error::InvalidArgument(format!(
            "{}: key {:#x} is not a TCP region's",
            what(),
            remote.key
        ))
    })
}

/// What a peer's one-sided transfer does to this rank's region, for the
/// words of its refusal.
#[derive(Clone, Copy)]
enum Access {
    Write,
    Read,
}

/// Bytes `[off, +len)` of the published region that a peer's one-sided
/// transfer names by `key`, bounds-checked; why not otherwise.
fn region_range(
    mems: &[Option<(MemPtr, usize)>],
    gens: &[u16],
    key: u32,
    off: u64,
    len: u64,
    access: Access,
) -> std::result::Result<MemPtr, String> {
    let (index, generation) = ((key & 0xffff) as usize, (key >> 16) as u16);
    let (did, into) = match access {
        Access::Write => ("wrote", "into"),
        Access::Read => ("read", "from"),
    };
    let Some((base, size)) = mems.get(index).copied().flatten() else {
        return Err(format!(
            "{did} one-sidedly {into} region {index}, which this rank has not registered"
        ));
    };
    if gens.get(index) != Some(&generation) {
        return Err(format!(
            "{did} one-sidedly {into} region {index} through a stale descriptor (registered anew since)"
        ));
    }
    if off.checked_add(len).is_none_or(|end| end > size as u64) {
        return Err(format!(
            "{did} [{off}, +{len}) {into} a published region of {size} bytes"
        ));
    }
    // SAFETY: off + len <= size, within the registered region.
    Ok(MemPtr(unsafe { base.0.add(off as usize) }))
}

fn start_payload(hdr: FrameHeader, p: &Posted<()>) -> Rx {
    // SAFETY: Tag::matches checked hdr.total == p.len and decode checked
    // offset + len <= total, so the destination lies within the posted range.
    let dst = MemPtr(unsafe { p.dst.0.add(hdr.offset as usize) });
    Rx::Payload {
        hdr,
        req: p.req,
        dst,
        got: 0,
    }
}

/// A read with at least this much of a frame's payload still to come asks
/// the kernel to acknowledge at once. A large message streams one way (a
/// reduce's segments towards the root, a one-way stream of sends), and
/// the receiver sends back only small control frames, so Linux may take
/// the exchange for an interactive one and delay its ACKs (up to its
/// delayed-ACK timeout) to ride on replies that do not come; the sender,
/// whose unacknowledged bytes fill its send buffer (`send_buffer_bytes`),
/// then waits. On the 2-core VM of 2026-12-06 a 2-rank reduce of 256 KiB
/// segments ran 2.5-15x slower at 16 MiB (10-60 ms) in 18 of 23 rounds of
/// a sequence of launches (each segment's transfer about 1 ms instead of
/// 50 µs, its RTT samples about 5 ms), and with this in 4 of 20 (7-20 ms):
/// much less often and less slow, not never
/// (`scripts/tcp-reduce-sequence.sh`). The option is not sticky (the kernel
/// goes back to delaying when it sees traffic both ways), hence at every
/// such read. Only large frames: asked at every payload read of 16
/// KiB or more, a 2-rank 16 KiB all-reduce ran 0.80x as fast (its ACKs
/// could ride on the reply, and now go alone) and 64 KiB 0.94x.
const QUICKACK_READ_BYTES: usize = 128 << 10;

/// `TCP_QUICKACK` on `sock` (see [`QUICKACK_READ_BYTES`]). Advisory: if it
/// fails, the socket keeps the kernel's default ACK timing.
fn ack_at_once(sock: &TcpStream) {
    let _ = socket2::SockRef::from(sock).set_quickack(true);
}

/// One non-blocking read of a frame's remaining bytes: `Some(n)` bytes came
/// in, `None` means the socket has nothing now (and is marked not readable).
fn read_some(
    sock: &mut TcpStream,
    stage: &mut Stage,
    readable: &mut bool,
    buf: &mut [u8],
    peer: Rank,
    addr: &str,
) -> Result<Option<usize>> {
    loop {
        match stage.read(sock, buf) {
            Ok(0) => return Err(closed(peer, addr, true)),
            Ok(n) => {
                if buf.len() >= QUICKACK_READ_BYTES {
                    ack_at_once(sock);
                }
                return Ok(Some(n));
            }
            Err(e) if would_block(&e) => {
                *readable = false;
                return Ok(None);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(peer_io_error(peer, addr, "receiving", e)),
        }
    }
}

/// A connection that `check_post` found ready is gone (cannot happen).
fn vanished(peer: Rank) -> Error {
    Error::Internal(format!("connection to rank {peer} vanished"))
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// A write failed because the peer's end of the socket is closed.
fn severed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::WriteZero
    )
}

fn closed(peer: Rank, addr: &str, mid_frame: bool) -> Error {
    Error::Remote {
        rank: peer,
        addr: addr.to_string(),
        what: if mid_frame {
            "closed the connection in the middle of a frame (process died?)".into()
        } else {
            "closed the connection (process exited or died)".into()
        },
    }
}

fn peer_io_error(peer: Rank, addr: &str, doing: &str, e: io::Error) -> Error {
    Error::Remote {
        rank: peer,
        addr: addr.to_string(),
        what: format!("connection failed while {doing}: {e}"),
    }
}

impl Transport for TcpTransport {
    fn properties(&self) -> Properties {
        Properties {
            name: "tcp",
            bandwidth_gbps: 1.0,
            latency_us: 25.0,
            // Emulated: `Put`, `Get` and `Fetched` frames over the stream.
            one_sided_write: true,
            one_sided_read: true,
            offloaded_writes: false,
            pins_memory: false,
            gpu_memory: false,
            max_segment: self.cfg.segment_bytes,
        }
    }

    fn attach(&mut self, registry: &Registry, token_base: usize) -> Result<()> {
        let reg = registry
            .try_clone()
            .map_err(|e| Error::sys("dup", "cloning the poll registry", e))?;
        self.listener.register(&reg, Token(token_base))?;
        self.registry = Some(reg);
        self.token_base = token_base;
        Ok(())
    }

    fn connect(&mut self, peer: Rank) -> Result<Readiness> {
        if peer == self.me || peer as usize >= self.peers.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {} cannot connect to rank {peer} (world size {})",
                self.me,
                self.peers.len()
            )));
        }
        if let Some(c) = self.conns.get(&peer) {
            if c.ready() {
                return Ok(Readiness::Ready);
            }
        } else if peer > self.me {
            self.start_dial(peer)?;
        } else {
            self.conn_entry(peer);
        }
        self.progress()?;
        Ok(if self.conns.get(&peer).is_some_and(Conn::ready) {
            Readiness::Ready
        } else {
            Readiness::Pending
        })
    }

    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<MemHandle> {
        if ptr.is_null() && len > 0 {
            return Err(Error::InvalidArgument("registering a null pointer".into()));
        }
        let entry = Some((MemPtr(ptr), len));
        if let Some(i) = self.free_mems.pop() {
            self.mems[i as usize] = entry;
            self.mem_gens[i as usize] = self.mem_gens[i as usize].wrapping_add(1);
            Ok(MemHandle::new(self.id, i))
        } else {
            self.mems.push(entry);
            self.mem_gens.push(0);
            Ok(MemHandle::new(self.id, (self.mems.len() - 1) as u32))
        }
    }

    fn deregister(&mut self, mem: MemHandle) -> Result<()> {
        let index = mem.index_for(self.id, "tcp")?;
        match self.mems.get_mut(index as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                self.free_mems.push(index);
                Ok(())
            }
            _ => Err(Error::InvalidUsage(format!(
                "memory handle {index} is not registered"
            ))),
        }
    }

    fn isend(
        &mut self,
        peer: Rank,
        tag: Tag,
        mem: MemHandle,
        offset: usize,
        len: usize,
    ) -> Result<Request> {
        self.check_send(peer, "isend to")?;
        let base = self.mem(mem, offset, len)?;
        let seg = self.cfg.segment_bytes;
        let nseg = len.div_ceil(seg).max(1);
        let me = self.me;
        let req = self.new_req(ReqState::Send {
            segments_left: nseg,
        });
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        // A message that fits the peer's small buffers goes on a small
        // credit or is announced; it never takes a frame credit, since the
        // peer tells the class from the size alone.
        let eager = if conn.fits_small(len) {
            conn.small_credits.take(1)
        } else {
            seg <= conn.peer_frame_bytes && conn.credits.take(nseg)
        };
        if eager {
            Self::queue_message(conn, me, seg, tag, base, len, req, false);
        } else {
            // No credit for it: announce it, and send it once its receive
            // is posted (the Cts), so that it never waits at the receiver.
            let id = conn.next_announce;
            conn.next_announce += 1;
            conn.announced.push_back(Announced {
                id,
                req,
                tag,
                base,
                len,
            });
            let hdr = FrameHeader {
                tag,
                offset: id,
                total: len as u64,
                ..FrameHeader::control(FrameKind::Rts, me, 0)
            };
            Self::queue_control(conn, hdr);
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
        self.check_post(peer, "irecv from")?;
        let ptr = self.mem(mem, offset, len)?;
        let req = self.new_req(ReqState::Recv);
        let cts = self.control(FrameKind::Cts);
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        let posted = Posted::new(req, tag, ptr, len, ());
        // SAFETY: ptr is valid for len bytes (checked against the
        // registration), which stays so until the request completes or the
        // transport is aborted (register's contract).
        match unsafe { conn.core.post(posted) }? {
            Posting::Done => {
                self.reqs.finish(req, ReqState::Done);
                return Ok(Request::new(self.id, req));
            }
            Posting::Pending => {}
            Posting::Clear { id, a: () } => {
                Self::queue_control(conn, FrameHeader { offset: id, ..cts })
            }
        }
        if conn.lanes.iter().flatten().all(|l| l.closed) {
            // Everything the peer sent before closing has been read already.
            if let Some(i) = conn.core.index_of(req) {
                conn.core.take(i);
            }
            self.reqs.remove(&req);
            return Err(Error::Remote {
                rank: peer,
                addr: conn.addr.clone(),
                what: "has shut its communicator down; nothing more can be received from it".into(),
            });
        }
        Ok(Request::new(self.id, req))
    }

    /// A small message (at most `SMALL` bytes) with a credit for it, to a
    /// peer whose lane 0 has nothing queued, is written by the caller: the
    /// posted path costs the sender a request, a registration and a
    /// progress pass that also reads the lanes, which on a one-way stream
    /// of 8-byte broadcasts was an empty `readv` per message, as dear as
    /// the `sendmsg` itself. A write that takes nothing hands the message
    /// to the posted path, its credits given back; of one that takes part,
    /// the rest is queued from a copy, which `unsent` reports until a
    /// progress pass has written it.
    fn send_now(
        &mut self,
        peer: Rank,
        tag: Tag,
        bytes: &[u8],
        _hint: Option<SendHint>,
    ) -> Result<Now> {
        self.check_send(peer, "send to")?;
        let len = bytes.len();
        if len > SMALL || len > self.cfg.segment_bytes {
            return Ok(Now::Later);
        }
        let mut credit = self.take_send_credit(peer, len);
        if credit.is_none() {
            // Credits come back in frames that only a read finds; this
            // caller may not have read the peer's lanes for a while.
            self.read_peer(peer)?;
            credit = self.take_send_credit(peer, len);
        }
        let Some(small) = credit else {
            return Ok(Now::Later);
        };
        let me = self.me;
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        let Some(lane) = conn.lanes[0].as_mut() else {
            return Err(vanished(peer));
        };
        let owed = conn.core.take_owed(1);
        let hdr = FrameHeader {
            kind: FrameKind::Data,
            cleared: false,
            credits: owed,
            src_rank: me,
            tag,
            offset: 0,
            len: len as u64,
            total: len as u64,
        }
        .encode();
        let done = loop {
            match nosignal::send_vectored(&lane.sock, &[IoSlice::new(&hdr), IoSlice::new(bytes)]) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "the connection closed");
                    return Err(peer_io_error(peer, &conn.addr, "sending", e));
                }
                Ok(n) => break n,
                Err(e) if would_block(&e) => {
                    // Nothing went: as if never asked. The credits go back
                    // where they came from.
                    lane.writable = false;
                    conn.core.give_owed(owed);
                    let credits = if small {
                        &mut conn.small_credits
                    } else {
                        &mut conn.credits
                    };
                    credits.give_back(1, peer)?;
                    return Ok(Now::Later);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(peer_io_error(peer, &conn.addr, "sending", e)),
            }
        };
        if done < HEADER_LEN + len {
            // Part of the frame is in the socket: the rest must follow,
            // from a copy, since the caller takes its buffer back now. The
            // engine keeps progressing until it has (`unsent`).
            lane.sendq.push_back(OutSeg {
                req: AT_ONCE,
                hdr,
                ptr: MemPtr(std::ptr::null_mut()),
                len,
                done,
                stamped: true,
                keep: Some(bytes.into()),
            });
            self.at_once_queued += 1;
        }
        Ok(Now::Done)
    }

    fn unsent(&self) -> bool {
        // Nothing is written after an abort.
        !self.aborted && self.at_once_queued > 0
    }

    /// The message is taken if lane 0's next frame is it, whole in the
    /// lane's stage (where the read of a small frame's header pulls its
    /// payload), with nothing else pending with the peer: the posted path
    /// costs a request, a registration, and a read pass that parks the
    /// frame for the receive to find.
    fn recv_now(&mut self, peer: Rank, tag: Tag, dst: &mut [u8]) -> Result<Now> {
        self.check_post(peer, "receive from")?;
        if dst.len() > SMALL {
            return Ok(Now::Later);
        }
        // A lane closed by the peer leaves the posted path to say so.
        let next = |t: &TcpTransport| {
            let c = t.conns.get(&peer)?;
            let lane = c.lanes[0].as_ref()?;
            let open = c.lanes.iter().flatten().all(|l| !l.closed);
            (open && c.core.is_idle()).then_some(lane.rx.at_frame_start())
        };
        match next(self) {
            None => return Ok(Now::Later),
            Some(true) => self.read_peer(peer)?,
            Some(false) => {}
        }
        let me = self.me;
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        let Some(lane) = conn.lanes[0].as_mut() else {
            return Err(vanished(peer));
        };
        if !conn.core.is_idle() {
            return Ok(Now::Later);
        }
        let hdr = match lane.rx {
            _ if lane.rx.at_frame_start() => return Ok(Now::Empty),
            Rx::Parked { hdr } => hdr,
            _ => return Ok(Now::Later),
        };
        let n = hdr.len as usize;
        if hdr.kind != FrameKind::Data
            || hdr.cleared
            || hdr.len != hdr.total
            || !tag.matches(me, &hdr, dst.len() as u64)?
            || lane.stage.staged() < n
        {
            return Ok(Now::Later);
        }
        if n > 0 {
            // Served from the stage, which holds all `n` bytes.
            lane.stage
                .read(&mut lane.sock, dst)
                .map_err(|e| peer_io_error(peer, &conn.addr, "receiving", e))?;
        }
        lane.rx = Rx::new();
        conn.core.consumed(&hdr);
        if credits_due(&conn.core) {
            // Small credits go back only in a `Credit` frame, which only a
            // progress pass writes, and a caller taking every message at
            // once may run none: the sender would run out, and announce.
            self.progress_sends()?;
        }
        Ok(Now::Done)
    }

    fn test(&mut self, req: Request) -> Result<Tested> {
        let id = req.id_for(self.id, "tcp")?;
        match self.reqs.get(&id) {
            Some(ReqState::Done) => {
                self.reqs.remove(&id);
                Ok(Tested::Done)
            }
            Some(_) => Ok(Tested::Pending(req)),
            None => Err(Error::Internal(format!(
                "tcp: request {id} is not in the request table"
            ))),
        }
    }

    fn finished(&self) -> Option<u64> {
        Some(self.reqs.finished())
    }

    fn progress(&mut self) -> Result<bool> {
        if self.aborted {
            return Ok(false);
        }
        let mut moved = false;
        if self.listener.busy()
            || self.registry.is_none()
            || self.conns.values().any(|c| !c.ready())
        {
            moved |= self.progress_accepts()?;
            moved |= self.progress_dials()?;
        }
        moved |= self.progress_sends()?;
        moved |= self.progress_recvs()?;
        // Zero-length receives can complete while matching.
        Ok(moved)
    }

    fn poke(&mut self) {
        // A lane wrongly marked ready costs one read or write that would
        // block, and clears the mark again. (Spinning on reads beats
        // spinning on poll(2) here: once the data is in, a read takes it in
        // one call where poll needs a read after it.) So the spin reads
        // only the sockets that matter: those of peers this rank waits on
        // (a posted receive, an announcement waiting for its clearance, a
        // send still going out), and of those, while only small messages
        // are expected, which all come on lane 0, that lane only. Every
        // `SWEEP_EVERY`th poke reads everything, for frames nobody asked for
        // yet. A rank that published a region reads every peer each time:
        // their one-sided writes and reads come unasked. At 8 ranks over
        // TCP, a broadcast leaf read all seven peers per turn, and nine in
        // ten of the reads came back empty.
        self.pokes = self.pokes.wrapping_add(1);
        let sweep = self.pokes.is_multiple_of(SWEEP_EVERY);
        let everyone = sweep || self.published || !self.reads.is_empty();
        for conn in self.conns.values_mut() {
            let posted = conn.core.posted();
            let all = sweep || posted.iter().any(|p| p.len > SMALL);
            let waited_on = everyone
                || !posted.is_empty()
                || !conn.announced.is_empty()
                || conn.lanes.iter().flatten().any(|l| !l.sendq.is_empty());
            for (i, lane) in conn.lanes.iter_mut().enumerate() {
                let Some(lane) = lane else { continue };
                lane.writable = true;
                if all || (i == 0 && waited_on) || !lane.rx.at_frame_start() {
                    lane.mark_readable();
                }
            }
        }
    }

    fn on_event(&mut self, event: &mio::event::Event) -> Result<()> {
        let off = event.token().0 - self.token_base;
        if off == 0 {
            // Accepted in progress(), so that a stranger costs the job's
            // own work at most one bounded call at a time.
            self.listener.mark_readable();
            return Ok(());
        }
        if let Some(&(peer, li)) = self.tokens.get(&off)
            && let Some(lane) = self.conns.get_mut(&peer).and_then(|c| c.lanes[li].as_mut())
        {
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                lane.mark_readable();
            }
            if event.is_writable() || event.is_write_closed() || event.is_error() {
                lane.writable = true;
            }
        }
        Ok(())
    }

    fn remote_region(&mut self, mem: MemHandle) -> Result<Option<RemoteRegion>> {
        let index = mem.index_for(self.id, "tcp")?;
        let Some((_, len)) = self.mems.get(index as usize).copied().flatten() else {
            return Err(Error::InvalidUsage(format!(
                "memory handle {index} is not registered"
            )));
        };
        let generation = self.mem_gens[index as usize];
        let key = put_key(index, generation).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "region {index}: TCP's one-sided writes name at most 65536 registrations"
            ))
        })?;
        self.published = true;
        Ok(Some(RemoteRegion {
            rank: self.me,
            key: u64::from(key),
            // Offset-addressed: the receiver adds the offset to its region.
            addr: 0,
            len: len as u64,
        }))
    }

    fn write_imm(&mut self, peer: Rank, w: &WriteImm) -> Result<Request> {
        self.check_send(peer, "write_imm to")?;
        let src = self.mem(w.mem, w.offset, w.len)?;
        let key = remote_key(
            peer,
            &w.remote,
            w.remote_offset,
            w.len,
            "write_imm to",
            "into",
        )?;
        let hdr = FrameHeader {
            offset: w.remote_offset,
            len: w.len as u64,
            total: (u64::from(key) << 32) | u64::from(w.imm),
            ..FrameHeader::control(FrameKind::Put, self.me, 0)
        };
        let req = self.new_req(ReqState::Send { segments_left: 1 });
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        let nl = conn.lanes.len();
        let li = if w.len <= SMALL {
            0
        } else {
            conn.next_lane = conn.next_lane.wrapping_add(1);
            conn.next_lane % nl
        };
        let Some(lane) = conn.lanes[li].as_mut() else {
            return Err(vanished(peer));
        };
        lane.sendq.push_back(OutSeg {
            req,
            hdr: hdr.encode(),
            ptr: src,
            len: w.len,
            done: 0,
            stamped: false,
            keep: None,
        });
        Ok(Request::new(self.id, req))
    }

    fn read(&mut self, peer: Rank, r: &ReadFrom) -> Result<Request> {
        self.check_send(peer, "read from")?;
        let dst = self.mem(r.mem, r.offset, r.len)?;
        let key = remote_key(
            peer,
            &r.remote,
            r.remote_offset,
            r.len,
            "read from",
            "out of",
        )?;
        // The answer's length travels in the header's 32-bit length field.
        if r.len >= u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "read from rank {peer}: {} bytes in one read; TCP's reads carry less than 4 GiB",
                r.len
            )));
        }
        let req = self.new_req(ReqState::Recv);
        let hdr = FrameHeader {
            offset: r.remote_offset,
            total: u64::from(key) << 32,
            tag: Tag {
                comm: req,
                seq: r.len as u64,
                ..Tag::NONE
            },
            ..FrameHeader::control(FrameKind::Get, self.me, 0)
        };
        let conn = self.conns.get_mut(&peer).ok_or_else(|| vanished(peer))?;
        Self::queue_control(conn, hdr);
        self.reads.insert(
            req,
            PendingRead {
                peer,
                dst,
                len: r.len,
            },
        );
        Ok(Request::new(self.id, req))
    }

    fn next_imm(&mut self) -> Result<Option<Arrival>> {
        if self.aborted {
            return Err(Error::Aborted("the TCP transport was aborted".into()));
        }
        Ok(self.imms.pop_front())
    }

    fn abort(&mut self, reason: &str) {
        self.imms.clear();
        self.reads.clear();
        let text = reason.as_bytes();
        let text = &text[..text.len().min(MAX_ABORT_TEXT as usize)];
        let hdr = control_header(FrameKind::Abort, self.me, text.len());
        for conn in self.conns.values_mut() {
            // Only a lane with nothing half-written can carry a whole frame now.
            if let Some(lane) = conn
                .lanes
                .iter_mut()
                .flatten()
                .find(|l| l.sendq.front().is_none_or(|s| s.done == 0))
            {
                let _ =
                    nosignal::send_vectored(&lane.sock, &[IoSlice::new(&hdr), IoSlice::new(text)]);
            }
            // The caller's buffers are handed back after an abort: forget every
            // pointer into them.
            conn.core.clear();
            conn.announced.clear();
            for lane in conn.lanes.iter_mut().flatten() {
                lane.sendq.clear();
                lane.rx = Rx::new();
            }
        }
        self.aborted = true;
    }
}

impl Drop for TcpTransport {
    /// Tells peers this rank is leaving cleanly, so that the end of the
    /// connection is not mistaken for a crash.
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        let hdr = control_header(FrameKind::Close, self.me, 0);
        for conn in self.conns.values_mut() {
            for lane in conn.lanes.iter_mut().flatten() {
                if lane.sendq.front().is_none_or(|s| s.done == 0) {
                    let _ = nosignal::send(&lane.sock, &hdr);
                }
                let _ = lane.sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_read;
