//! One transport for every network interface that can write into a peer's
//! memory: the protocol driver ([`NicTransport`]) is written once, against
//! the small [`Nic`] trait, and each RDMA stack implements the trait:
//! libfabric ([`crate::ofi`], every provider) and verbs (`crate::verbs`,
//! the `verbs` feature).
//!
//! Why one driver: the protocol (eager frames into posted bounce buffers,
//! announced large messages written with immediate data into granted
//! receives, one-sided writes and reads into published regions, credits,
//! aborts) is the same whatever moves the bytes, and it is the part with
//! the bugs. libfabric's `tcp;ofi_rxm` and `shm` providers run it here, so
//! every line of it is tested in CI; a verbs build adds only the trait's
//! thin translation onto libibverbs, which needs a device to run.

mod driver;
#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;

pub use driver::{NicConfig, NicTransport};
#[cfg(test)]
pub(crate) use driver::{name_from_hex, name_to_hex};

use crate::seam::Rank;
use std::os::fd::RawFd;

/// A one-sided operation's far end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAt<A> {
    /// The connected peer.
    pub peer: A,
    /// The address its registration said to use.
    pub addr: u64,
    /// Its registration's key.
    pub key: u64,
}

/// One completion, as the driver needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// The context the work was posted with; `None` for a completion of no
    /// posted work (an immediate that consumed no receive).
    pub ctx: Option<u64>,
    /// A peer's immediate data: its one-sided write has landed here.
    pub imm: Option<u64>,
    /// Bytes received, for receives.
    pub len: usize,
}

/// Why a NIC call failed.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    /// No room in the queue now; nothing was posted.
    #[error("the queue is full")]
    Again,
    /// Posted work completed with an error.
    #[error("{text}")]
    Completion { ctx: Option<u64>, text: String },
    /// Anything else, in the stack's words.
    #[error("{0}")]
    Other(String),
}

/// What the driver asks of an RDMA stack. Every posting call is `unsafe`:
/// the caller keeps the local bytes registered, valid and (for sends and
/// writes) unchanged until the work's completion is polled.
pub trait Nic: Send {
    /// The transport's name, in `Properties` and in errors: "ofi", "verbs".
    const NAME: &'static str;
    /// A connected peer, as work is addressed to it.
    type Addr: Copy + std::fmt::Debug + Send;
    /// A registration of local memory.
    type Mr: std::fmt::Debug + Send;
    /// What one work request needs of a registration.
    type Local: Copy + std::fmt::Debug + Send;

    /// The stack and device, for errors and logs ("ofi tcp;ofi_rxm").
    fn label(&self) -> &str;
    /// Whether one-sided work moves without the peer's CPU.
    fn offloaded(&self) -> bool;
    /// This rank's address, to publish.
    fn name(&self) -> Result<Vec<u8>, NicError>;
    /// Makes `peer`, whose published name is `name`, addressable.
    fn connect(&mut self, peer: Rank, name: &[u8]) -> Result<Self::Addr, NicError>;
    /// Registers `[ptr, ptr + len)`, `len > 0`, for local and remote access.
    ///
    /// # Safety
    /// The memory stays allocated while the registration lives.
    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<Self::Mr, NicError>;
    /// What work requests need of `mr`.
    fn local(mr: &Self::Mr) -> Self::Local;
    /// The key a peer writes into `mr` with.
    fn key(mr: &Self::Mr) -> u64;
    /// The address a peer names `at` (inside `mr`) by; `None` outside it.
    fn remote_addr(mr: &Self::Mr, at: *const u8) -> Option<u64>;
    /// Where `mr` starts.
    fn base(mr: &Self::Mr) -> *const u8;

    /// Sends `len` bytes at `src` into `to`'s next posted receive.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn send(
        &mut self,
        src: *const u8,
        len: usize,
        local: Self::Local,
        to: Self::Addr,
        ctx: u64,
    ) -> Result<(), NicError>;
    /// Posts a receive of up to `len` bytes at `dst` into the pool that
    /// every peer's frames and immediates draw on.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn recv(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: Self::Local,
        ctx: u64,
    ) -> Result<(), NicError>;
    /// Writes `len` bytes at `src` into `to`, then delivers `imm` there.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn write_imm(
        &mut self,
        src: *const u8,
        len: usize,
        local: Self::Local,
        imm: u32,
        to: RemoteAt<Self::Addr>,
        ctx: u64,
    ) -> Result<(), NicError>;
    /// Reads `len` bytes of `from` into `dst`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn read(
        &mut self,
        dst: *mut u8,
        len: usize,
        local: Self::Local,
        from: RemoteAt<Self::Addr>,
        ctx: u64,
    ) -> Result<(), NicError>;
    /// Moves completions into `out`; an error completion is returned as
    /// [`NicError::Completion`] after the good ones before it.
    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, NicError>;
    /// A descriptor that becomes readable when work completes, if any.
    fn wait_fd(&self) -> Option<RawFd>;
    /// Whether the engine may now sleep on [`Nic::wait_fd`]: nothing has
    /// completed unseen, and the descriptor will wake it when something does.
    fn trywait(&mut self) -> bool;
}
