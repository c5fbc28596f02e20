//! The small FFI helpers every device module uses, and the check that this
//! crate's copies of verbs constants match the headers rdma-sys was built
//! against.
//!
//! The pure modules (`status`, `completion`, `qp_plan`, `port`) carry their
//! own copies of `enum ibv_*` codes so that they build and are tested
//! without rdma-core's headers; the tests here fail if any copy ever
//! disagrees with `<infiniband/verbs.h>` as bindgen read it.

use crate::error::Errno;
use std::ffi::CStr;

/// `ibv_wc_status_str(status)`: libibverbs' name for a completion status.
pub(crate) fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str takes any value (unknown ones map to
    // "unknown") and returns a pointer to a static string, never NULL.
    let p = unsafe { rdma_sys::ibv_wc_status_str(status) };
    if p.is_null() {
        return "unknown".into();
    }
    // SAFETY: p points to a NUL-terminated static string (checked non-NULL).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The errno a verbs call that returns an error code (not -1) gave back:
/// most return the errno itself, some a negated one, a few -1 with errno
/// set.
pub(crate) fn rc_errno(rc: i32) -> Errno {
    match rc {
        -1 => Errno::last(),
        rc if rc < 0 => Errno(-rc),
        rc => Errno(rc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::{WC_WITH_IMM, code as op};
    use crate::qp_plan::{access, mask};
    use crate::status::code as st;
    use rdma_sys::*;

    #[test]
    fn status_codes_match_verbs_h() {
        use ibv_wc_status::*;
        let pairs = [
            (st::SUCCESS, IBV_WC_SUCCESS),
            (st::LOC_LEN_ERR, IBV_WC_LOC_LEN_ERR),
            (st::LOC_PROT_ERR, IBV_WC_LOC_PROT_ERR),
            (st::WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR),
            (st::REM_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR),
            (st::RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR),
            (st::RNR_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR),
            (st::GENERAL_ERR, IBV_WC_GENERAL_ERR),
            (st::TM_RNDV_INCOMPLETE, IBV_WC_TM_RNDV_INCOMPLETE),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours, theirs);
        }
        assert_eq!(
            wc_status_str(IBV_WC_RETRY_EXC_ERR),
            "transport retry counter exceeded"
        );
    }

    #[test]
    fn opcodes_and_flags_match_verbs_h() {
        use ibv_wc_opcode::*;
        assert_eq!(op::SEND, IBV_WC_SEND);
        assert_eq!(op::RDMA_WRITE, IBV_WC_RDMA_WRITE);
        assert_eq!(op::RDMA_READ, IBV_WC_RDMA_READ);
        assert_eq!(op::RECV, IBV_WC_RECV);
        assert_eq!(op::RECV_RDMA_WITH_IMM, IBV_WC_RECV_RDMA_WITH_IMM);
        assert_eq!(WC_WITH_IMM, ibv_wc_flags::IBV_WC_WITH_IMM.0);
        assert_eq!(
            access::LOCAL_WRITE,
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
        );
        assert_eq!(
            access::REMOTE_WRITE,
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        );
        assert_eq!(
            access::REMOTE_READ,
            ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
        );
        assert_eq!(ibv_mtu::IBV_MTU_256, crate::port::Mtu::B256.code());
        assert_eq!(ibv_mtu::IBV_MTU_4096, crate::port::Mtu::B4096.code());
        assert_eq!(
            crate::port::PortState::from_code(ibv_port_state::IBV_PORT_ACTIVE),
            crate::port::PortState::Active
        );
    }

    #[test]
    fn qp_attr_masks_match_verbs_h() {
        let m = |x: ibv_qp_attr_mask| x.0;
        let pairs = [
            (mask::STATE, m(ibv_qp_attr_mask::IBV_QP_STATE)),
            (mask::ACCESS_FLAGS, m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)),
            (mask::PKEY_INDEX, m(ibv_qp_attr_mask::IBV_QP_PKEY_INDEX)),
            (mask::PORT, m(ibv_qp_attr_mask::IBV_QP_PORT)),
            (mask::AV, m(ibv_qp_attr_mask::IBV_QP_AV)),
            (mask::PATH_MTU, m(ibv_qp_attr_mask::IBV_QP_PATH_MTU)),
            (mask::TIMEOUT, m(ibv_qp_attr_mask::IBV_QP_TIMEOUT)),
            (mask::RETRY_CNT, m(ibv_qp_attr_mask::IBV_QP_RETRY_CNT)),
            (mask::RNR_RETRY, m(ibv_qp_attr_mask::IBV_QP_RNR_RETRY)),
            (mask::RQ_PSN, m(ibv_qp_attr_mask::IBV_QP_RQ_PSN)),
            (
                mask::MAX_QP_RD_ATOMIC,
                m(ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC),
            ),
            (
                mask::MIN_RNR_TIMER,
                m(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER),
            ),
            (mask::SQ_PSN, m(ibv_qp_attr_mask::IBV_QP_SQ_PSN)),
            (
                mask::MAX_DEST_RD_ATOMIC,
                m(ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC),
            ),
            (mask::DEST_QPN, m(ibv_qp_attr_mask::IBV_QP_DEST_QPN)),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours, theirs);
        }
    }

    /// rdma-sys writes `ibv_send_wr`, `ibv_wc` and the address vector by
    /// hand (bindgen cannot do their unions), and they are exactly what the
    /// post and poll paths hand to the provider. These are gcc's sizes and
    /// offsets for `<infiniband/verbs.h>` on x86-64 Linux (rdma-core 44; the
    /// layout is ABI and has not changed since these fields existed).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn hand_written_structs_match_the_c_layout() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, opcode), 28);
        assert_eq!(offset_of!(ibv_send_wr, send_flags), 32);
        assert_eq!(offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union), 36);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(rdma_t, rkey), 8);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, vendor_err), 16);
        assert_eq!(offset_of!(ibv_wc, byte_len), 20);
        assert_eq!(offset_of!(ibv_wc, imm_data_invalidated_rkey_union), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(
            offset_of!(ibv_qp_attr, ah_attr)
                + offset_of!(ibv_ah_attr, grh)
                + offset_of!(ibv_global_route, sgid_index),
            76
        );
        assert_eq!(
            offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_ah_attr, dlid),
            80
        );
        assert_eq!(
            offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_ah_attr, is_global),
            85
        );
        assert_eq!(
            offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_ah_attr, port_num),
            86
        );
        assert_eq!(offset_of!(ibv_qp_attr, port_num), 129);
        assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
        assert_eq!(offset_of!(ibv_qp_attr, rnr_retry), 132);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
    }

    #[test]
    fn return_codes_become_errnos() {
        assert_eq!(rc_errno(22), Errno(22));
        assert_eq!(rc_errno(-22), Errno(22));
    }
}
