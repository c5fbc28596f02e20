//! [`VerbsNic`]: the driver's [`Nic`] on one RDMA device. Every call here
//! translates one driver call into one verbs call; what the protocol
//! decides is in `crate::nic`, tested over libfabric.

use super::{completions, names};
use crate::error::{Error, Result};
use crate::nic::{Cqe, Nic, NicConfig, NicError, NicTransport, RemoteAt};
use crate::seam::Rank;
use gw_verbs::{
    CompChannel, Completion, CompletionQueue, Hca, Init, MemoryRegion, ProtectionDomain, Qp,
    QpOptions, ReadyToSend, RemoteAddr, SharedReceiveQueue, Slice,
};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};

/// Completions read from the device at once.
const POLL_BATCH: usize = 64;
/// RDMA reads in flight per queue pair, where the device allows as many.
const READS_IN_FLIGHT: u8 = 16;
/// The fewest sends a queue pair may queue when a large world shares the
/// completion queue.
const MIN_SEND_DEPTH: u32 = 16;

/// The transport on a verbs device.
pub type VerbsTransport = NicTransport<VerbsNic>;

/// A queue pair on its way to RTS.
enum Conn {
    Init(Qp<Init>),
    Ready(Qp<ReadyToSend>),
}

/// The device, its protection domain, one completion queue, one shared
/// receive queue and a queue pair per peer.
pub struct VerbsNic {
    // Dropped in order: queue pairs before the queues and the domain they
    // use (each also holds what it needs alive).
    conns: Vec<Option<Conn>>,
    srq: SharedReceiveQueue,
    cq: CompletionQueue,
    channel: CompChannel,
    pd: ProtectionDomain,
    hca: Hca,
    me: Rank,
    label: String,
    /// Completions read but not handed to the driver yet.
    stash: VecDeque<Completion>,
    raw: Vec<Completion>,
}

impl std::fmt::Debug for VerbsNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNic")
            .field("device", &self.hca)
            .finish()
    }
}

fn other(e: gw_verbs::Error) -> NicError {
    NicError::Other(e.to_string())
}

/// A post refused because the send queue is full is the driver's "again".
fn posted(r: gw_verbs::Result<()>) -> Result<(), NicError> {
    match r {
        Ok(()) => Ok(()),
        Err(gw_verbs::Error::PostSend { errno, .. }) if errno.0 == libc::ENOMEM => {
            Err(NicError::Again)
        }
        Err(e) => Err(other(e)),
    }
}

/// A local range as one work request names it.
///
/// # Safety
/// `[at, at + len)` lies inside the registration whose key is `lkey`,
/// which outlives the work request.
unsafe fn slice(at: *const u8, len: usize, lkey: u32) -> Result<Slice<'static>, NicError> {
    // The driver cuts messages to the port's largest (see `open`).
    let len = u32::try_from(len)
        .map_err(|_| NicError::Other(format!("{len} bytes are more than one work request")))?;
    // SAFETY: the caller's promise.
    Ok(unsafe { Slice::from_raw(at as u64, len, lkey) })
}

fn remote(to: &RemoteAt<Rank>) -> Result<RemoteAddr, NicError> {
    Ok(RemoteAddr {
        addr: to.addr,
        rkey: completions::rkey(to)?,
    })
}

impl VerbsNic {
    /// Opens the device `cfg` names (or the first) for rank `me` of
    /// `world`, with a shared receive queue for `receives` posted receives
    /// and a queue pair in INIT for every peer; also returns the largest
    /// message of the port.
    pub fn open(
        cfg: &gw_verbs::Config,
        me: Rank,
        world: usize,
        receives: usize,
    ) -> Result<(VerbsNic, usize)> {
        let setup = |what: &str, e: gw_verbs::Error| Error::Config(format!("verbs: {what}: {e}"));
        let hca =
            gw_verbs::open(cfg).map_err(|e| Error::Config(format!("GW_TRANSPORT=verbs: {e}")))?;
        let lim = *hca.limits();
        let receives = u32::try_from(receives).unwrap_or(u32::MAX);
        if receives > lim.max_srq_wr {
            return Err(Error::Config(format!(
                "verbs: {} holds at most {} receives in a shared receive queue; a world of \
                 {world} needs {receives} (lower GW_EAGER_FRAMES)",
                hca.name(),
                lim.max_srq_wr
            )));
        }
        let pd = hca
            .alloc_pd()
            .map_err(|e| setup("allocating a protection domain", e))?;
        let channel = hca
            .create_comp_channel()
            .map_err(|e| setup("creating a completion channel", e))?;
        let srq = hca
            .create_srq(&pd, receives)
            .map_err(|e| setup("creating the shared receive queue", e))?;
        // One completion queue takes every send and every receive: the
        // send queues shrink (toward MIN_SEND_DEPTH) to fit the device's.
        let peers = world.saturating_sub(1).max(1) as u64;
        let room = u64::from(lim.max_cqe).saturating_sub(u64::from(receives));
        let send_depth = u64::from(QpOptions::default().send_depth)
            .min(room / peers)
            .max(u64::from(MIN_SEND_DEPTH)) as u32;
        let depth = peers * u64::from(send_depth) + u64::from(receives);
        let depth = u32::try_from(depth)
            .ok()
            .filter(|&d| d <= lim.max_cqe)
            .ok_or_else(|| {
                Error::Config(format!(
                    "verbs: a world of {world} needs a completion queue of {depth} entries; {} \
                     allows {}",
                    hca.name(),
                    lim.max_cqe
                ))
            })?;
        let cq = hca
            .create_cq(depth, Some(&channel))
            .map_err(|e| setup("creating the completion queue", e))?;
        let rd = lim.rd_atomic(READS_IN_FLIGHT);
        let opts = QpOptions {
            send_depth,
            max_rd_atomic: rd,
            ..QpOptions::default()
        };
        let conns = (0..world as Rank)
            .map(|r| -> Result<Option<Conn>> {
                if r == me {
                    return Ok(None);
                }
                let qp = hca
                    .create_qp_on_srq(&pd, &cq, &cq, &srq, &opts)
                    .and_then(Qp::into_init)
                    .map_err(|e| setup(&format!("the queue pair for rank {r}"), e))?;
                Ok(Some(Conn::Init(qp)))
            })
            .collect::<Result<Vec<_>>>()?;
        let label = format!("verbs {} port {}", hca.name(), hca.port().num);
        tracing::info!(
            "{label}: {} queue pairs of {send_depth} sends, {receives} shared receives, \
             {rd} reads in flight, messages up to {} B",
            conns.iter().flatten().count(),
            lim.max_msg_sz
        );
        let nic = VerbsNic {
            conns,
            srq,
            cq,
            channel,
            pd,
            hca,
            me,
            label,
            stash: VecDeque::with_capacity(2 * POLL_BATCH),
            raw: vec![Completion::default(); POLL_BATCH],
        };
        Ok((nic, lim.max_msg_sz.max(1) as usize))
    }

    fn ready(&mut self, peer: Rank) -> Result<&mut Qp<ReadyToSend>, NicError> {
        match self.conns.get_mut(peer as usize) {
            Some(Some(Conn::Ready(qp))) => Ok(qp),
            _ => Err(NicError::Other(format!(
                "rank {peer} has no connected queue pair"
            ))),
        }
    }

    /// Reads the device into the stash.
    fn fill(&mut self) -> Result<(), NicError> {
        let n = self.cq.poll(&mut self.raw).map_err(other)?;
        self.stash.extend(&self.raw[..n]);
        Ok(())
    }
}

impl Nic for VerbsNic {
    const NAME: &'static str = "verbs";
    type Addr = Rank;
    type Mr = MemoryRegion;
    type Local = u32;

    fn label(&self) -> &str {
        &self.label
    }

    fn offloaded(&self) -> bool {
        true
    }

    fn name(&self) -> Result<Vec<u8>, NicError> {
        let eps: Vec<_> = self
            .conns
            .iter()
            .map(|c| match c {
                Some(Conn::Init(qp)) => Some(qp.endpoint()),
                Some(Conn::Ready(qp)) => Some(qp.endpoint()),
                None => None,
            })
            .collect();
        Ok(names::encode(&eps))
    }

    fn connect(&mut self, peer: Rank, name: &[u8]) -> Result<Rank, NicError> {
        let world = self.conns.len();
        match self.conns.get(peer as usize) {
            None => return Err(NicError::Other(format!("rank {peer} is outside the world"))),
            Some(None) => return Err(NicError::Other(format!("rank {peer} is this rank"))),
            Some(Some(Conn::Ready(_))) => return Ok(peer),
            Some(Some(Conn::Init(_))) => {}
        }
        // Decoded before the queue pair is taken out: a bad name leaves it
        // in place. A failed transition destroys it (see gw-verbs' qp.rs);
        // its receives are in the shared queue, so nothing is lost with it.
        let remote = names::endpoint_for(name, peer, self.me, world)
            .map_err(|e| NicError::Other(e.to_string()))?;
        let Some(Conn::Init(conn)) = self.conns[peer as usize].take() else {
            return Err(NicError::Other(format!(
                "rank {peer}'s queue pair vanished"
            )));
        };
        let qp = conn
            .into_rtr(&remote)
            .and_then(gw_verbs::Qp::into_rts)
            .map_err(other)?;
        self.conns[peer as usize] = Some(Conn::Ready(qp));
        Ok(peer)
    }

    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<MemoryRegion, NicError> {
        // SAFETY: the caller keeps the memory valid while registered.
        unsafe { self.pd.register(ptr, len) }.map_err(other)
    }

    fn local(mr: &MemoryRegion) -> u32 {
        mr.lkey()
    }

    fn key(mr: &MemoryRegion) -> u64 {
        u64::from(mr.rkey())
    }

    fn remote_addr(mr: &MemoryRegion, at: *const u8) -> Option<u64> {
        let a = at as u64;
        (a >= mr.addr() && a <= mr.addr() + mr.len() as u64).then_some(a)
    }

    fn base(mr: &MemoryRegion) -> *const u8 {
        mr.addr() as *const u8
    }

    unsafe fn send(
        &mut self,
        src: *const u8,
        len: usize,
        local: u32,
        to: Rank,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: the driver's promise (see `Nic`).
        let s = unsafe { slice(src, len, local) }?;
        posted(self.ready(to)?.post_send(ctx, s))
    }

    unsafe fn recv(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: u32,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        let s = unsafe { slice(dst, len, local) }?;
        self.srq.post_recv(ctx, s).map_err(other)
    }

    unsafe fn write_imm(
        &mut self,
        src: *const u8,
        len: usize,
        local: u32,
        imm: u32,
        to: RemoteAt<Rank>,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        let s = unsafe { slice(src, len, local) }?;
        let dst = remote(&to)?;
        posted(self.ready(to.peer)?.post_write_imm(ctx, s, dst, imm))
    }

    unsafe fn read(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: u32,
        from: RemoteAt<Rank>,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        let d = unsafe { slice(dst, len, local) }?;
        let src = remote(&from)?;
        posted(self.ready(from.peer)?.post_read(ctx, d, src))
    }

    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, NicError> {
        if self.stash.is_empty() {
            self.fill()?;
        }
        completions::take(&mut self.stash, out)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.channel.as_raw_fd())
    }

    fn trywait(&mut self) -> bool {
        if !self.stash.is_empty() || self.channel.drain().is_err() || self.cq.arm().is_err() {
            return false;
        }
        // What completed before the queue was armed raised no event.
        self.fill().is_ok() && self.stash.is_empty()
    }
}

impl NicTransport<VerbsNic> {
    /// Opens the device and its queue pairs for rank `me` of `world`;
    /// peers are named later ([`NicTransport::set_peers`]), then connected
    /// all at once ([`VerbsTransport::connect_all`]).
    pub fn open(
        me: Rank,
        world: usize,
        device: &gw_verbs::Config,
        cfg: NicConfig,
    ) -> Result<VerbsTransport> {
        let receives = NicTransport::<VerbsNic>::bounce_buffers(world, cfg.eager_frames);
        let (nic, max_msg) = VerbsNic::open(device, me, world, receives)?;
        NicTransport::new(nic, me, world, cfg, max_msg)
    }

    /// Brings every peer's queue pair to RTS (see the module comment).
    pub fn connect_all(&mut self) -> Result<()> {
        use crate::seam::Transport;
        for peer in 0..self.world() as Rank {
            if peer != self.rank() {
                self.connect(peer)?;
            }
        }
        Ok(())
    }
}
