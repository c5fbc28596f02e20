//! The libfabric backend (`GW_TRANSPORT=ofi`): one RDM endpoint per rank,
//! driven by the protocol of [`crate::nic`].
//!
//! The same code runs on every provider libfabric has: `verbs;ofi_rxm`
//! (InfiniBand, RoCE), `efa` (AWS), and, with no hardware, `tcp;ofi_rxm`
//! and `shm`, which is how CI exercises the protocol. What differs between
//! providers (memory-registration modes, context modes, whether an
//! immediate consumes a posted receive) is handled by `gw-ofi` and here,
//! not by the driver. Endpoint names travel in the rendezvous records
//! (hex); a peer's address is inserted into the address vector when it is
//! first connected.

#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::nic::{Cqe, Nic, NicConfig, NicError, NicTransport, RemoteAt};
use crate::seam::Rank;
use gw_ofi::{Completion, Domain, Endpoint, EpConfig, Fabric, FiAddr, Mr, MrDesc, Remote};
use std::os::fd::RawFd;

/// How the libfabric transport is set up.
#[derive(Clone, Debug, Default)]
pub struct OfiConfig {
    /// A provider name (`"tcp;ofi_rxm"`, `"shm"`, `"verbs;ofi_rxm"`,
    /// `"efa"`), or `None` for the best available.
    pub provider: Option<String>,
    /// The protocol's sizes.
    pub nic: NicConfig,
}

/// The libfabric transport.
pub type OfiTransport = NicTransport<OfiNic>;

/// A libfabric endpoint as the driver's [`Nic`].
pub struct OfiNic {
    // Dropped first: the endpoint before its domain and fabric.
    ep: Endpoint,
    label: String,
    provider: String,
    comps: Vec<Completion>,
    _domain: Domain,
    _fabric: Fabric,
}

impl std::fmt::Debug for OfiNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiNic")
            .field("provider", &self.provider)
            .finish()
    }
}

fn access() -> u64 {
    gw_ofi::FI_SEND
        | gw_ofi::FI_RECV
        | gw_ofi::FI_READ
        | gw_ofi::FI_WRITE
        | gw_ofi::FI_REMOTE_READ
        | gw_ofi::FI_REMOTE_WRITE
}

/// Whether `provider` moves one-sided writes in hardware: not the ones that
/// emulate RMA in software (over sockets, or by copying between processes).
fn offloaded(provider: &str) -> bool {
    let core = provider.split(';').next().unwrap_or(provider);
    !matches!(core, "tcp" | "shm" | "sockets" | "udp" | "net" | "sm2")
}

fn setup(what: &str, e: gw_ofi::Error) -> Error {
    Error::Config(format!("ofi: {what}: {e}"))
}

fn nic_error(e: gw_ofi::Error) -> NicError {
    match e {
        gw_ofi::Error::Again => NicError::Again,
        gw_ofi::Error::Completion { ctx, .. } => NicError::Completion {
            ctx,
            text: e.to_string(),
        },
        e => NicError::Other(e.to_string()),
    }
}

fn remote(to: RemoteAt<FiAddr>) -> Remote {
    Remote {
        dest: to.peer,
        addr: to.addr,
        key: to.key,
    }
}

impl OfiNic {
    /// Opens the fabric, domain and endpoint for a world of `world`; also
    /// returns the provider's largest message.
    fn open(world: usize, provider: Option<&str>) -> Result<(OfiNic, usize)> {
        let fabric = Fabric::open(provider).map_err(|e| setup("choosing a provider", e))?;
        let info = fabric.info().clone();
        tracing::info!(
            "ofi: provider {} on {} ({}); mr_mode {}, mode {}, {} B of immediate data, {}",
            info.provider,
            info.domain,
            info.fabric,
            info.mr_mode_names(),
            info.mode_names(),
            info.cq_data_size,
            fabric.choice()
        );
        let domain = Domain::open(&fabric).map_err(|e| setup("opening the domain", e))?;
        let ep = Endpoint::open(
            &domain,
            &EpConfig {
                av_count: world.max(1),
                ..EpConfig::default()
            },
        )
        .map_err(|e| setup("opening the endpoint", e))?;
        if let Some(why) = ep.wait_refused() {
            tracing::info!("ofi: no wait object ({why}): the engine polls the completion queue");
        }
        let nic = OfiNic {
            ep,
            label: format!("ofi {}", info.provider),
            provider: info.provider.clone(),
            comps: vec![Completion::default(); 64],
            _domain: domain,
            _fabric: fabric,
        };
        Ok((nic, info.max_msg_size))
    }
}

impl Nic for OfiNic {
    const NAME: &'static str = "ofi";
    type Addr = FiAddr;
    type Mr = Mr;
    type Local = Option<MrDesc>;

    fn label(&self) -> &str {
        &self.label
    }

    fn offloaded(&self) -> bool {
        offloaded(&self.provider)
    }

    fn name(&self) -> Result<Vec<u8>, NicError> {
        self.ep.name().map_err(nic_error)
    }

    fn connect(&mut self, _peer: Rank, name: &[u8]) -> Result<FiAddr, NicError> {
        self.ep.insert_peer(name).map_err(nic_error)
    }

    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<Mr, NicError> {
        // SAFETY: the caller keeps the memory valid while registered.
        unsafe { self.ep.register(ptr, len, access()) }.map_err(nic_error)
    }

    fn local(mr: &Mr) -> Option<MrDesc> {
        mr.desc()
    }

    fn key(mr: &Mr) -> u64 {
        mr.key()
    }

    fn remote_addr(mr: &Mr, at: *const u8) -> Option<u64> {
        mr.remote_addr(at)
    }

    fn base(mr: &Mr) -> *const u8 {
        mr.base()
    }

    unsafe fn send(
        &mut self,
        src: *const u8,
        len: usize,
        local: Option<MrDesc>,
        to: FiAddr,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: the driver's promise (see `Nic`) is passed on.
        unsafe { self.ep.send(src, len, local, to, ctx) }.map_err(nic_error)
    }

    unsafe fn recv(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: Option<MrDesc>,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        unsafe { self.ep.recv(dst, len, local, ctx) }.map_err(nic_error)
    }

    unsafe fn write_imm(
        &mut self,
        src: *const u8,
        len: usize,
        local: Option<MrDesc>,
        imm: u32,
        to: RemoteAt<FiAddr>,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        unsafe {
            self.ep
                .writedata(src, len, local, u64::from(imm), remote(to), ctx)
        }
        .map_err(nic_error)
    }

    unsafe fn read(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: Option<MrDesc>,
        from: RemoteAt<FiAddr>,
        ctx: u64,
    ) -> Result<(), NicError> {
        // SAFETY: as for send.
        unsafe { self.ep.read(dst, len, local, remote(from), ctx) }.map_err(nic_error)
    }

    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, NicError> {
        let want = out.len().min(self.comps.len());
        let n = self
            .ep
            .poll_cq(&mut self.comps[..want])
            .map_err(nic_error)?;
        for (o, c) in out.iter_mut().zip(&self.comps[..n]) {
            *o = Cqe {
                ctx: c.ctx,
                imm: (c.flags & gw_ofi::FI_REMOTE_CQ_DATA != 0).then_some(c.data),
                len: c.len,
            };
        }
        Ok(n)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.ep.wait_fd()
    }

    fn trywait(&mut self) -> bool {
        self.ep.trywait().unwrap_or(false)
    }
}

impl NicTransport<OfiNic> {
    /// Opens the fabric, the endpoint and its buffers for rank `me` of
    /// `world`; peers are named later ([`NicTransport::set_peer_names`]).
    pub fn open(me: Rank, world: usize, cfg: OfiConfig) -> Result<OfiTransport> {
        let (nic, max_msg) = OfiNic::open(world, cfg.provider.as_deref())?;
        NicTransport::new(nic, me, world, cfg.nic, max_msg)
    }

    /// Whether device memory could move by GPUDirect RDMA on this
    /// transport's provider, or why not, in words (for `GW_DEBUG=info`).
    pub fn gpudirect(&self) -> String {
        let p = self.provider();
        match gw_ofi::hmem_support(p) {
            // Device memory through shm goes by CUDA IPC, not a NIC.
            Ok(None) if p == "shm" => {
                "off (provider shm moves data within one host: its FI_HMEM is CUDA IPC, \
                 not a NIC)"
                    .into()
            }
            Ok(None) => format!(
                "possible (provider {p} offers FI_HMEM), not used yet: device data is staged \
                 through pinned host memory"
            ),
            Ok(Some(why)) => format!("off ({why})"),
            Err(e) => format!("off (fi_getinfo for FI_HMEM failed: {e})"),
        }
    }

    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.nic().provider
    }
}
