//! Reliable-connected queue pairs, with their state in the type.
//!
//! A queue pair must go RESET → INIT → RTR (ready to receive) → RTS (ready
//! to send) before it sends, and verbs let a program post in the wrong state
//! and find out from a flushed completion much later. Here each state is a
//! type ([`Reset`], [`Init`], [`ReadyToReceive`], [`ReadyToSend`]); each
//! transition consumes the queue pair and returns it in the next state, so
//! sends and writes exist only on `Qp<ReadyToSend>` and receives only from
//! INIT on. A failed transition returns the error and destroys the queue
//! pair (there is no way back on a half-configured one in this design: the
//! caller makes a new one). The attributes and masks each transition sets
//! come from the pure plans in `qp_plan.rs`.
//!
//! Immediates go out in network byte order ([`crate::completion::imm_to_wire`]),
//! and a write with immediate consumes a receive posted at the peer, so the
//! peer must keep receives posted for every write it expects.

use crate::completion::imm_to_wire;
use crate::cq::{CompletionQueue, Cq};
use crate::device::Hca;
use crate::endpoint::{MAX_24, QpEndpoint};
use crate::error::{Errno, Error, Result};
use crate::mr::{Pd, ProtectionDomain, RemoteAddr, Slice};
use crate::qp_plan::{
    InitPlan, LocalPath, QpOptions, RtrPlan, RtsPlan, init_plan, rtr_plan, rts_plan,
};
use crate::srq::{SharedReceiveQueue, Srq};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Just created: nothing can be posted.
#[derive(Debug)]
pub enum Reset {}
/// Bound to a port: receives can be posted.
#[derive(Debug)]
pub enum Init {}
/// Connected to the peer: receives complete.
#[derive(Debug)]
pub enum ReadyToReceive {}
/// Fully up: sends and writes can be posted.
#[derive(Debug)]
pub enum ReadyToSend {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Init {}
    impl Sealed for super::ReadyToReceive {}
    impl Sealed for super::ReadyToSend {}
}

/// The states in which receives may be posted.
pub trait Receiving: sealed::Sealed {}
impl Receiving for Init {}
impl Receiving for ReadyToReceive {}
impl Receiving for ReadyToSend {}

struct Inner {
    qp: *mut rdma_sys::ibv_qp,
    qpn: u32,
    psn: u32,
    path: LocalPath,
    opts: QpOptions,
    // Dropped after the queue pair (fields drop in order after Drop::drop).
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
    _pd: Arc<Pd>,
}

// SAFETY: a queue pair may be used from any thread (libibverbs serialises
// posts on one QP); posting needs &mut, so one thread posts at a time.
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: qp came from ibv_create_qp and is destroyed once; its CQs
        // and PD outlive it (held above).
        let rc = unsafe { rdma_sys::ibv_destroy_qp(self.qp) };
        if rc != 0 {
            tracing::warn!(
                qpn = self.qpn,
                "ibv_destroy_qp failed: {}",
                crate::sys::rc_errno(rc)
            );
        }
    }
}

/// A reliable-connected queue pair in state `S`.
pub struct Qp<S> {
    inner: Inner,
    _state: PhantomData<S>,
}

impl<S> std::fmt::Debug for Qp<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.inner.qpn)
            .field("state", &std::any::type_name::<S>())
            .finish()
    }
}

/// A starting packet sequence number: any 24-bit value; a random one keeps
/// a restarted peer's stale packets from matching.
fn random_psn(qpn: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(qpn);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() as u32) & MAX_24
}

impl Hca {
    /// Creates a reliable-connected queue pair in `pd`, completing sends on
    /// `send_cq` and receives on `recv_cq`, with `opts`' depths.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &QpOptions,
    ) -> Result<Qp<Reset>> {
        self.make_qp(pd, send_cq, recv_cq, None, opts)
    }

    /// As [`Hca::create_qp`], taking its receives from `srq`: receives are
    /// then posted there, never on the queue pair.
    pub fn create_qp_on_srq(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: &SharedReceiveQueue,
        opts: &QpOptions,
    ) -> Result<Qp<Reset>> {
        self.make_qp(pd, send_cq, recv_cq, Some(srq), opts)
    }

    fn make_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: Option<&SharedReceiveQueue>,
        opts: &QpOptions,
    ) -> Result<Qp<Reset>> {
        opts.validate()?;
        // SAFETY: an all-zero ibv_qp_init_attr is valid (NULL pointers, zero
        // counts); the fields gradwire needs are set below.
        let mut attr: rdma_sys::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.send_cq = send_cq.inner.cq;
        attr.recv_cq = recv_cq.inner.cq;
        attr.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = opts.send_depth;
        attr.cap.max_recv_wr = opts.recv_depth;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = opts.max_inline;
        if let Some(q) = srq {
            attr.srq = q.inner.srq;
            attr.cap.max_recv_wr = 0;
        }
        // SAFETY: pd and both CQs are alive (held by the new queue pair).
        let qp = unsafe { rdma_sys::ibv_create_qp(pd.pd.pd, &mut attr) };
        if qp.is_null() {
            return Err(Error::CreateQp {
                call: "ibv_create_qp",
                send_depth: opts.send_depth,
                recv_depth: opts.recv_depth,
                errno: Errno::last(),
            });
        }
        // SAFETY: ibv_create_qp succeeded, so qp points to a valid ibv_qp.
        let qpn = unsafe { (*qp).qp_num };
        let mut opts = *opts;
        // The device may have granted more inline room than asked for.
        opts.max_inline = attr.cap.max_inline_data.min(opts.max_inline);
        Ok(Qp {
            inner: Inner {
                qp,
                qpn,
                psn: random_psn(qpn),
                path: self.local_path(),
                opts,
                _send_cq: send_cq.inner.clone(),
                _recv_cq: recv_cq.inner.clone(),
                _srq: srq.map(|q| q.inner.clone()),
                _pd: pd.pd.clone(),
            },
            _state: PhantomData,
        })
    }
}

impl<S> Qp<S> {
    /// Its queue pair number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What the peer needs to connect to it (publish it, encoded, through
    /// the rendezvous store).
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.inner.qpn,
            psn: self.inner.psn,
            lid: self.inner.path.lid,
            gid: self.inner.path.gid,
            mtu: self.inner.path.mtu,
        }
    }

    fn into_state<T>(self) -> Qp<T> {
        Qp {
            inner: self.inner,
            _state: PhantomData,
        }
    }

    fn modify(
        &mut self,
        attr: &mut rdma_sys::ibv_qp_attr,
        mask: u32,
        to: &'static str,
    ) -> Result<()> {
        // SAFETY: the queue pair is alive and attr is a fully initialised
        // ibv_qp_attr whose fields named by mask are set.
        let rc = unsafe { rdma_sys::ibv_modify_qp(self.inner.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(Error::ModifyQp {
                call: "ibv_modify_qp",
                to,
                errno: crate::sys::rc_errno(rc),
            });
        }
        Ok(())
    }
}

fn zeroed_attr() -> rdma_sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data (integers and the address vector,
    // also plain data); all-zero is a valid value of every field.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// Copies an INIT plan into the C struct.
fn init_attr(p: &InitPlan) -> rdma_sys::ibv_qp_attr {
    let mut a = zeroed_attr();
    a.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_INIT;
    a.pkey_index = p.pkey_index;
    a.port_num = p.port;
    a.qp_access_flags = p.access;
    a
}

/// Copies an RTS plan into the C struct.
fn rts_attr(p: &RtsPlan) -> rdma_sys::ibv_qp_attr {
    let mut a = zeroed_attr();
    a.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_RTS;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.sq_psn = p.sq_psn;
    a.max_rd_atomic = p.max_rd_atomic;
    a
}

/// Copies an RTR plan into the C struct.
fn rtr_attr(p: &RtrPlan) -> rdma_sys::ibv_qp_attr {
    let mut a = zeroed_attr();
    a.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = p.path_mtu.code();
    a.dest_qp_num = p.dest_qpn;
    a.rq_psn = p.rq_psn;
    a.max_dest_rd_atomic = p.max_dest_rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr.dlid = p.av.dlid;
    a.ah_attr.sl = p.av.sl;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = p.av.port;
    a.ah_attr.is_global = u8::from(p.av.is_global);
    if p.av.is_global {
        a.ah_attr.grh.dgid = rdma_sys::ibv_gid { raw: p.av.dgid };
        a.ah_attr.grh.sgid_index = p.av.sgid_index;
        a.ah_attr.grh.hop_limit = p.av.hop_limit;
        a.ah_attr.grh.traffic_class = p.av.traffic_class;
        a.ah_attr.grh.flow_label = 0;
    }
    a
}

impl Qp<Reset> {
    /// RESET → INIT: binds it to the port and grants local write, remote
    /// write and remote read.
    pub fn into_init(mut self) -> Result<Qp<Init>> {
        let p = init_plan(self.inner.path.port);
        let mut a = init_attr(&p);
        self.modify(&mut a, p.mask, "INIT")?;
        Ok(self.into_state())
    }
}

impl Qp<Init> {
    /// INIT → RTR toward `remote` (as the peer published it): the path,
    /// the smaller of both ports' MTUs, the peer's queue pair and PSN.
    pub fn into_rtr(mut self, remote: &QpEndpoint) -> Result<Qp<ReadyToReceive>> {
        let p = rtr_plan(&self.inner.path, remote, &self.inner.opts)?;
        let mut a = rtr_attr(&p);
        self.modify(&mut a, p.mask, "RTR")?;
        tracing::debug!(
            qpn = self.inner.qpn,
            peer_qpn = remote.qpn,
            mtu = %p.path_mtu,
            "verbs: queue pair ready to receive"
        );
        Ok(self.into_state())
    }
}

impl Qp<ReadyToReceive> {
    /// RTR → RTS: timeouts, retry counts and this side's first PSN.
    pub fn into_rts(mut self) -> Result<Qp<ReadyToSend>> {
        let p = rts_plan(self.inner.psn, &self.inner.opts);
        let mut a = rts_attr(&p);
        self.modify(&mut a, p.mask, "RTS")?;
        Ok(self.into_state())
    }
}

impl<S: Receiving> Qp<S> {
    /// Posts a receive into `dst`, or a zero-length one (`None`) that only
    /// an immediate can fill: every RDMA WRITE WITH IMM from the peer
    /// consumes one posted receive.
    pub fn post_recv(&mut self, wr_id: u64, dst: Option<Slice<'_>>) -> Result<()> {
        let mut sge = dst.map(|s| s.sge());
        let mut wr = rdma_sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge.as_mut().map_or(std::ptr::null_mut(), |s| s as *mut _),
            num_sge: i32::from(sge.is_some()),
        };
        let mut bad: *mut rdma_sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the queue pair is alive; wr and its sge live across the
        // call (libibverbs copies them); the memory they name is registered
        // (a Slice borrows its region) and its owner promised, at
        // registration, not to race the device.
        let rc = unsafe { rdma_sys::ibv_post_recv(self.inner.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::PostRecv {
                call: "ibv_post_recv",
                wr_id,
                errno: crate::sys::rc_errno(rc),
            });
        }
        Ok(())
    }
}

impl Qp<ReadyToSend> {
    /// Posts an RDMA WRITE WITH IMM: `src`'s bytes land at `dst` in the
    /// peer's memory, then the peer's next posted receive completes with
    /// `imm` (sent in network byte order). Always signalled: it completes
    /// on the send queue's CQ once the peer has acknowledged it.
    pub fn post_write_imm(
        &mut self,
        wr_id: u64,
        src: Slice<'_>,
        dst: RemoteAddr,
        imm: u32,
    ) -> Result<()> {
        let mut wr = self.send_wr(
            wr_id,
            src,
            rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        );
        wr.imm_data_invalidated_rkey_union.imm_data = imm_to_wire(imm);
        wr.wr.rdma = rdma_sys::rdma_t {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        self.post(wr, src)
    }

    /// Posts an RDMA READ: the peer's bytes at `src` land in `dst`, the
    /// peer's CPU taking no part. Always signalled.
    pub fn post_read(&mut self, wr_id: u64, dst: Slice<'_>, src: RemoteAddr) -> Result<()> {
        let mut wr = self.send_wr(wr_id, dst, rdma_sys::ibv_wr_opcode::IBV_WR_RDMA_READ);
        wr.wr.rdma = rdma_sys::rdma_t {
            remote_addr: src.addr,
            rkey: src.rkey,
        };
        self.post(wr, dst)
    }

    /// Posts a send of `src` (a control message) into the peer's next
    /// posted receive. Messages up to the inline limit are copied at post.
    pub fn post_send(&mut self, wr_id: u64, src: Slice<'_>) -> Result<()> {
        let wr = self.send_wr(wr_id, src, rdma_sys::ibv_wr_opcode::IBV_WR_SEND);
        self.post(wr, src)
    }

    fn send_wr(&self, wr_id: u64, src: Slice<'_>, opcode: u32) -> rdma_sys::ibv_send_wr {
        // SAFETY: ibv_send_wr is plain data (integers, pointers and unions of
        // them); all-zero is a valid value.
        let mut wr: rdma_sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        let mut flags = rdma_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if opcode == rdma_sys::ibv_wr_opcode::IBV_WR_SEND && src.len() <= self.inner.opts.max_inline
        {
            flags |= rdma_sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        wr
    }

    fn post(&mut self, mut wr: rdma_sys::ibv_send_wr, src: Slice<'_>) -> Result<()> {
        let mut sge = src.sge();
        if !src.is_empty() {
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
        }
        let mut bad: *mut rdma_sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the queue pair is alive and in RTS; wr and sge live across
        // the call (libibverbs copies them, and inline data is copied
        // before it returns); the local memory is registered (the Slice
        // borrows its region), and the remote address and key are checked
        // by the peer's device, which fails the request rather than write
        // outside its registration.
        let rc = unsafe { rdma_sys::ibv_post_send(self.inner.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::PostSend {
                call: "ibv_post_send",
                wr_id: wr.wr_id,
                errno: crate::sys::rc_errno(rc),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::{LinkLayer, Mtu};
    use rdma_sys::ibv_qp_state::*;

    fn path(link_layer: LinkLayer) -> LocalPath {
        LocalPath {
            port: 1,
            link_layer,
            mtu: Mtu::B4096,
            lid: 3,
            gid_index: 5,
            gid: [7; 16],
        }
    }

    fn peer() -> QpEndpoint {
        QpEndpoint {
            qpn: 0x1234,
            psn: 0x00ab_cdef,
            lid: 9,
            gid: [8; 16],
            mtu: Mtu::B1024,
        }
    }

    #[test]
    fn init_attr_carries_the_plan() {
        let a = init_attr(&init_plan(2));
        assert_eq!(a.qp_state, IBV_QPS_INIT);
        assert_eq!(a.port_num, 2);
        assert_eq!(a.pkey_index, 0);
        assert_eq!(a.qp_access_flags, crate::qp_plan::ACCESS);
    }

    #[test]
    fn rtr_attr_on_roce_sends_a_grh() {
        let p = rtr_plan(&path(LinkLayer::Ethernet), &peer(), &QpOptions::default()).unwrap();
        let a = rtr_attr(&p);
        assert_eq!(a.qp_state, IBV_QPS_RTR);
        assert_eq!(a.path_mtu, rdma_sys::ibv_mtu::IBV_MTU_1024);
        assert_eq!(a.dest_qp_num, 0x1234);
        assert_eq!(a.rq_psn, 0x00ab_cdef);
        assert_eq!(a.max_dest_rd_atomic, 1);
        assert_eq!(a.min_rnr_timer, 12);
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.port_num, 1);
        assert_eq!(a.ah_attr.dlid, 0);
        assert_eq!(a.ah_attr.grh.sgid_index, 5);
        assert_eq!(a.ah_attr.grh.hop_limit, crate::qp_plan::HOP_LIMIT);
        // SAFETY: reading the raw bytes of a GID just written as raw bytes.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, [8; 16]);
    }

    #[test]
    fn rtr_attr_on_infiniband_routes_by_lid() {
        let p = rtr_plan(&path(LinkLayer::Infiniband), &peer(), &QpOptions::default()).unwrap();
        let a = rtr_attr(&p);
        assert_eq!(a.ah_attr.is_global, 0);
        assert_eq!(a.ah_attr.dlid, 9);
        assert_eq!(a.ah_attr.port_num, 1);
        // SAFETY: as above; an IB path leaves the GRH zero.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, [0; 16]);
    }

    #[test]
    fn rts_attr_carries_the_plan() {
        let a = rts_attr(&rts_plan(0x42, &QpOptions::default()));
        assert_eq!(a.qp_state, IBV_QPS_RTS);
        assert_eq!(a.sq_psn, 0x42);
        assert_eq!(a.timeout, 14);
        assert_eq!(a.retry_cnt, 7);
        assert_eq!(a.rnr_retry, 7);
        assert_eq!(a.max_rd_atomic, 1);
    }

    #[test]
    fn psns_are_24_bit_and_vary() {
        let psns: std::collections::HashSet<u32> = (0..64).map(|_| random_psn(7)).collect();
        assert!(psns.iter().all(|&p| p <= MAX_24));
        assert!(psns.len() > 1);
    }
}
