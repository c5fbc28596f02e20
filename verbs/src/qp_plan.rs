//! What each queue-pair transition sets, computed without a device.
//!
//! `ibv_modify_qp` takes an attribute struct and a mask saying which of its
//! fields to apply, and each transition of a reliable-connected queue pair
//! requires an exact set: too few and the call fails with a bare `EINVAL`,
//! a wrong value (RoCE without `is_global`, a GID index that is not there,
//! an MTU larger than the peer's) and it succeeds but no packet ever
//! arrives, which shows up seconds later as `IBV_WC_RETRY_EXC_ERR`. So the
//! masks and values are pure functions ([`init_plan`], [`rtr_plan`],
//! [`rts_plan`]) tested here, and `qp.rs` only copies a plan into the C
//! struct. The mask bits are `enum ibv_qp_attr_mask` of
//! `<infiniband/verbs.h>`; a test checks them against rdma-sys.

use crate::endpoint::QpEndpoint;
use crate::error::{Error, Result};
use crate::port::{LinkLayer, Mtu, path_mtu};

/// `enum ibv_qp_attr_mask` bits.
pub mod mask {
    pub const STATE: u32 = 1 << 0;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `enum ibv_access_flags` bits a queue pair or registration grants.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1 << 0;
    pub const REMOTE_WRITE: u32 = 1 << 1;
    pub const REMOTE_READ: u32 = 1 << 2;
}

/// What gradwire registers memory with, and lets peers do on a queue pair:
/// local write (receives land), remote write (one-sided writes land) and
/// remote read.
pub const ACCESS: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

/// Hop limit of RoCE v2 packets: routers may sit between ranks.
pub const HOP_LIMIT: u8 = 64;

/// Reliability and depth settings of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpOptions {
    /// Local ACK timeout, 4.096 µs × 2^timeout (14: about 67 ms).
    pub timeout: u8,
    /// Retransmissions before `IBV_WC_RETRY_EXC_ERR` (at most 7).
    pub retry_cnt: u8,
    /// Retries on receiver-not-ready before `IBV_WC_RNR_RETRY_EXC_ERR` (7: forever).
    pub rnr_retry: u8,
    /// The RNR NAK timer code the peer is told to wait (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// RDMA reads in flight this side may issue, and accept from the peer.
    pub max_rd_atomic: u8,
    pub send_depth: u32,
    pub recv_depth: u32,
    /// Bytes a send may carry inline (copied at post time).
    pub max_inline: u32,
    /// Service level (InfiniBand) or priority (RoCE).
    pub service_level: u8,
    /// IPv6 traffic class of RoCE v2 packets (DSCP << 2).
    pub traffic_class: u8,
}

impl Default for QpOptions {
    fn default() -> QpOptions {
        QpOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            send_depth: 256,
            recv_depth: 256,
            max_inline: 64,
            service_level: 0,
            traffic_class: 0,
        }
    }
}

impl QpOptions {
    /// Checks every value fits its field: verbs would refuse it with a bare
    /// `EINVAL` at some later transition, or silently truncate it.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| {
            Err(Error::InvalidArgument(format!(
                "queue pair options: {what}"
            )))
        };
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad(format!(
                "retry counts are 3-bit: retry_cnt {} and rnr_retry {} must be at most 7",
                self.retry_cnt, self.rnr_retry
            ));
        }
        if self.timeout > 31 || self.min_rnr_timer > 31 {
            return bad(format!(
                "timers are 5-bit codes: timeout {} and min_rnr_timer {} must be at most 31",
                self.timeout, self.min_rnr_timer
            ));
        }
        if self.send_depth == 0 || self.recv_depth == 0 {
            return bad(format!(
                "send depth {} and receive depth {} must be at least 1",
                self.send_depth, self.recv_depth
            ));
        }
        if self.service_level > 15 {
            return bad(format!("service level {} is past 15", self.service_level));
        }
        Ok(())
    }
}

/// What the device allows, as `ibv_query_device` and `ibv_query_port`
/// report it: what gradwire sizes its queues and reads by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Entries of one completion queue.
    pub max_cqe: u32,
    /// Work requests of one shared receive queue.
    pub max_srq_wr: u32,
    /// RDMA reads a queue pair may have in flight as target / initiator.
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    /// Largest message of the port.
    pub max_msg_sz: u32,
}

impl DeviceLimits {
    /// Reads in flight per queue pair both ways: `wanted`, within what the
    /// device allows (at least 1; the field is 8 bits).
    pub fn rd_atomic(&self, wanted: u8) -> u8 {
        let cap = self
            .max_qp_rd_atom
            .min(self.max_qp_init_rd_atom)
            .clamp(1, 255);
        wanted.clamp(1, cap as u8)
    }
}

/// This side of the connection: the port and GID its queue pair uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPath {
    pub port: u8,
    pub link_layer: LinkLayer,
    pub mtu: Mtu,
    pub lid: u16,
    pub gid_index: u8,
    pub gid: [u8; 16],
}

/// RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitPlan {
    pub mask: u32,
    pub pkey_index: u16,
    pub port: u8,
    pub access: u32,
}

/// The address vector of RTR (`struct ibv_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    pub dlid: u16,
    pub sl: u8,
    pub port: u8,
    /// Whether a GRH is sent (RoCE always; InfiniBand not within a subnet).
    pub is_global: bool,
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// INIT → RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrPlan {
    pub mask: u32,
    pub path_mtu: Mtu,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub av: AddressVector,
}

/// RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsPlan {
    pub mask: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub sq_psn: u32,
    pub max_rd_atomic: u8,
}

/// RESET → INIT: the port, partition key 0, and what peers may do.
pub fn init_plan(port: u8) -> InitPlan {
    InitPlan {
        mask: mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS,
        pkey_index: 0,
        port,
        access: ACCESS,
    }
}

/// INIT → RTR, toward `remote`: the path (LID on InfiniBand, GRH with this
/// side's GID index and the peer's GID on RoCE), the MTU both ports carry,
/// the peer's queue pair and first PSN.
pub fn rtr_plan(local: &LocalPath, remote: &QpEndpoint, opts: &QpOptions) -> Result<RtrPlan> {
    opts.validate()?;
    let av = match local.link_layer {
        LinkLayer::Infiniband => {
            if remote.lid == 0 {
                return Err(Error::InvalidArgument(format!(
                    "the peer's InfiniBand port (queue pair {:#x}) has LID 0: is a subnet manager running?",
                    remote.qpn
                )));
            }
            AddressVector {
                dlid: remote.lid,
                sl: opts.service_level,
                port: local.port,
                is_global: false,
                dgid: [0; 16],
                sgid_index: 0,
                hop_limit: 0,
                traffic_class: 0,
            }
        }
        LinkLayer::Ethernet => {
            if remote.gid == [0; 16] {
                return Err(Error::InvalidArgument(format!(
                    "the peer's RoCE endpoint (queue pair {:#x}) has an all-zero GID",
                    remote.qpn
                )));
            }
            AddressVector {
                dlid: 0,
                sl: opts.service_level,
                port: local.port,
                is_global: true,
                dgid: remote.gid,
                sgid_index: local.gid_index,
                hop_limit: HOP_LIMIT,
                traffic_class: opts.traffic_class,
            }
        }
    };
    Ok(RtrPlan {
        mask: mask::STATE
            | mask::AV
            | mask::PATH_MTU
            | mask::DEST_QPN
            | mask::RQ_PSN
            | mask::MAX_DEST_RD_ATOMIC
            | mask::MIN_RNR_TIMER,
        path_mtu: path_mtu(local.mtu, remote.mtu),
        dest_qpn: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: opts.max_rd_atomic,
        min_rnr_timer: opts.min_rnr_timer,
        av,
    })
}

/// RTR → RTS: timeouts, retries and this side's first PSN.
pub fn rts_plan(local_psn: u32, opts: &QpOptions) -> RtsPlan {
    RtsPlan {
        mask: mask::STATE
            | mask::TIMEOUT
            | mask::RETRY_CNT
            | mask::RNR_RETRY
            | mask::SQ_PSN
            | mask::MAX_QP_RD_ATOMIC,
        timeout: opts.timeout,
        retry_cnt: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        sq_psn: local_psn & crate::endpoint::MAX_24,
        max_rd_atomic: opts.max_rd_atomic,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_in_flight_stay_within_what_the_device_allows() {
        let lim = |rd, init| DeviceLimits {
            max_cqe: 1 << 16,
            max_srq_wr: 1 << 14,
            max_qp_rd_atom: rd,
            max_qp_init_rd_atom: init,
            max_msg_sz: 1 << 30,
        };
        assert_eq!(lim(16, 16).rd_atomic(16), 16);
        assert_eq!(lim(16, 4).rd_atomic(16), 4);
        assert_eq!(lim(0, 0).rd_atomic(16), 1);
        assert_eq!(lim(1000, 1000).rd_atomic(200), 200);
        assert_eq!(lim(16, 16).rd_atomic(0), 1);
    }

    use super::*;

    fn roce() -> LocalPath {
        LocalPath {
            port: 1,
            link_layer: LinkLayer::Ethernet,
            mtu: Mtu::B4096,
            lid: 0,
            gid_index: 3,
            gid: [1; 16],
        }
    }

    fn peer(mtu: Mtu) -> QpEndpoint {
        QpEndpoint {
            qpn: 0x11,
            psn: 0x222,
            lid: 9,
            gid: [2; 16],
            mtu,
        }
    }

    #[test]
    fn init_sets_port_pkey_and_access() {
        let p = init_plan(2);
        assert_eq!(p.mask, 0b11_1001);
        assert_eq!(p.port, 2);
        assert_eq!(p.pkey_index, 0);
        assert_eq!(p.access, 0b111);
    }

    #[test]
    fn rtr_mask_is_exactly_what_rc_requires() {
        let p = rtr_plan(&roce(), &peer(Mtu::B1024), &QpOptions::default()).unwrap();
        assert_eq!(
            p.mask,
            mask::STATE
                | mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER
        );
        assert_eq!(p.mask, 0x0012_9181);
        assert_eq!(p.dest_qpn, 0x11);
        assert_eq!(p.rq_psn, 0x222);
        assert_eq!(p.min_rnr_timer, 12);
        assert_eq!(p.max_dest_rd_atomic, 1);
    }

    #[test]
    fn path_mtu_is_the_smaller_port() {
        let o = QpOptions::default();
        assert_eq!(
            rtr_plan(&roce(), &peer(Mtu::B1024), &o).unwrap().path_mtu,
            Mtu::B1024
        );
        let mut small = roce();
        small.mtu = Mtu::B512;
        assert_eq!(
            rtr_plan(&small, &peer(Mtu::B4096), &o).unwrap().path_mtu,
            Mtu::B512
        );
    }

    #[test]
    fn roce_sends_a_grh_from_the_chosen_gid() {
        let p = rtr_plan(&roce(), &peer(Mtu::B4096), &QpOptions::default()).unwrap();
        assert!(p.av.is_global);
        assert_eq!(p.av.dgid, [2; 16]);
        assert_eq!(p.av.sgid_index, 3);
        assert_eq!(p.av.hop_limit, HOP_LIMIT);
        assert!(p.av.hop_limit > 1);
        assert_eq!(p.av.dlid, 0);
        assert_eq!(p.av.port, 1);
        let mut zero = peer(Mtu::B4096);
        zero.gid = [0; 16];
        let e = rtr_plan(&roce(), &zero, &QpOptions::default()).unwrap_err();
        assert!(e.to_string().contains("all-zero GID"), "{e}");
    }

    #[test]
    fn infiniband_routes_by_lid() {
        let mut ib = roce();
        ib.link_layer = LinkLayer::Infiniband;
        ib.lid = 4;
        let p = rtr_plan(&ib, &peer(Mtu::B4096), &QpOptions::default()).unwrap();
        assert!(!p.av.is_global);
        assert_eq!(p.av.dlid, 9);
        assert_eq!(p.av.port, 1);
        let mut no_lid = peer(Mtu::B4096);
        no_lid.lid = 0;
        let e = rtr_plan(&ib, &no_lid, &QpOptions::default()).unwrap_err();
        assert!(e.to_string().contains("subnet manager"), "{e}");
    }

    #[test]
    fn rts_sets_retries_and_the_local_psn() {
        let o = QpOptions::default();
        let p = rts_plan(0x1234, &o);
        assert_eq!(
            p.mask,
            mask::STATE
                | mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::SQ_PSN
                | mask::MAX_QP_RD_ATOMIC
        );
        assert_eq!(p.mask, 0x0001_2e01);
        assert_eq!(p.sq_psn, 0x1234);
        assert_eq!(p.timeout, 14);
        assert_eq!(p.retry_cnt, 7);
        assert_eq!(p.rnr_retry, 7);
        assert_eq!(rts_plan(0xffff_ffff, &o).sq_psn, 0xff_ffff);
    }

    #[test]
    fn options_must_fit_their_fields() {
        QpOptions::default().validate().unwrap();
        let d = QpOptions::default();
        for (o, what) in [
            (QpOptions { retry_cnt: 8, ..d }, "retry counts are 3-bit"),
            (QpOptions { rnr_retry: 8, ..d }, "retry counts are 3-bit"),
            (QpOptions { timeout: 32, ..d }, "timers are 5-bit"),
            (
                QpOptions {
                    min_rnr_timer: 32,
                    ..d
                },
                "timers are 5-bit",
            ),
            (QpOptions { send_depth: 0, ..d }, "at least 1"),
            (QpOptions { recv_depth: 0, ..d }, "at least 1"),
            (
                QpOptions {
                    service_level: 16,
                    ..d
                },
                "service level",
            ),
        ] {
            let e = o.validate().unwrap_err().to_string();
            assert!(e.starts_with("queue pair options: "), "{e}");
            assert!(e.contains(what), "{e}");
            assert!(rtr_plan(&roce(), &peer(Mtu::B4096), &o).is_err());
        }
    }

    #[test]
    fn masks_of_different_transitions_share_only_the_state_bit() {
        let i = init_plan(1).mask;
        let r = rtr_plan(&roce(), &peer(Mtu::B4096), &QpOptions::default())
            .unwrap()
            .mask;
        let s = rts_plan(0, &QpOptions::default()).mask;
        assert_eq!(i & r, mask::STATE);
        assert_eq!(r & s, mask::STATE);
        assert_eq!(i & s, mask::STATE);
    }
}
