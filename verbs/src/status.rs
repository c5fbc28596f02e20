//! What a failed completion means, in words that say what to check.
//!
//! A work request that fails completes with an `enum ibv_wc_status` code, and
//! `ibv_wc_status_str` names it ("transport retry counter exceeded") without
//! saying why it happens. The three that a misconfigured job meets first get
//! advice here; the rest are named by `ibv_wc_status_str` where the `verbs`
//! feature links libibverbs, and by this crate's copy of its table where it
//! does not. The codes are those of `<infiniband/verbs.h>`, an ABI that has
//! not changed since it was written; a test checks them against rdma-sys.

/// `enum ibv_wc_status` codes.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const LOC_LEN_ERR: u32 = 1;
    pub const LOC_QP_OP_ERR: u32 = 2;
    pub const LOC_EEC_OP_ERR: u32 = 3;
    pub const LOC_PROT_ERR: u32 = 4;
    pub const WR_FLUSH_ERR: u32 = 5;
    pub const MW_BIND_ERR: u32 = 6;
    pub const BAD_RESP_ERR: u32 = 7;
    pub const LOC_ACCESS_ERR: u32 = 8;
    pub const REM_INV_REQ_ERR: u32 = 9;
    pub const REM_ACCESS_ERR: u32 = 10;
    pub const REM_OP_ERR: u32 = 11;
    pub const RETRY_EXC_ERR: u32 = 12;
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    pub const LOC_RDD_VIOL_ERR: u32 = 14;
    pub const REM_INV_RD_REQ_ERR: u32 = 15;
    pub const REM_ABORT_ERR: u32 = 16;
    pub const INV_EECN_ERR: u32 = 17;
    pub const INV_EEC_STATE_ERR: u32 = 18;
    pub const FATAL_ERR: u32 = 19;
    pub const RESP_TIMEOUT_ERR: u32 = 20;
    pub const GENERAL_ERR: u32 = 21;
    pub const TM_ERR: u32 = 22;
    pub const TM_RNDV_INCOMPLETE: u32 = 23;
}

/// The status's C name (`IBV_WC_RETRY_EXC_ERR`), for messages.
pub fn status_name(status: u32) -> Option<&'static str> {
    use code::*;
    Some(match status {
        SUCCESS => "IBV_WC_SUCCESS",
        LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
        LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
        LOC_EEC_OP_ERR => "IBV_WC_LOC_EEC_OP_ERR",
        LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
        WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
        MW_BIND_ERR => "IBV_WC_MW_BIND_ERR",
        BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR",
        REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
        REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        REM_OP_ERR => "IBV_WC_REM_OP_ERR",
        RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        LOC_RDD_VIOL_ERR => "IBV_WC_LOC_RDD_VIOL_ERR",
        REM_INV_RD_REQ_ERR => "IBV_WC_REM_INV_RD_REQ_ERR",
        REM_ABORT_ERR => "IBV_WC_REM_ABORT_ERR",
        INV_EECN_ERR => "IBV_WC_INV_EECN_ERR",
        INV_EEC_STATE_ERR => "IBV_WC_INV_EEC_STATE_ERR",
        FATAL_ERR => "IBV_WC_FATAL_ERR",
        RESP_TIMEOUT_ERR => "IBV_WC_RESP_TIMEOUT_ERR",
        GENERAL_ERR => "IBV_WC_GENERAL_ERR",
        TM_ERR => "IBV_WC_TM_ERR",
        TM_RNDV_INCOMPLETE => "IBV_WC_TM_RNDV_INCOMPLETE",
        _ => return None,
    })
}

/// What to check for the statuses a misconfigured job meets first.
pub fn advice(status: u32) -> Option<&'static str> {
    use code::*;
    Some(match status {
        RETRY_EXC_ERR => {
            "peer unreachable or GID/MTU mismatch: check GW_IB_GID_INDEX and that both ports are ACTIVE"
        }
        REM_ACCESS_ERR => "remote key or address wrong",
        RNR_RETRY_EXC_ERR => "peer had no receive posted",
        WR_FLUSH_ERR => {
            "the queue pair had already failed: an earlier completion carries the cause"
        }
        _ => return None,
    })
}

/// `ibv_wc_status_str`'s text, from libibverbs when it is linked, else
/// from this crate's copy of its table (rdma-core's `libibverbs/verbs.c`).
pub fn status_str(status: u32) -> String {
    #[cfg(feature = "verbs")]
    {
        crate::sys::wc_status_str(status)
    }
    #[cfg(not(feature = "verbs"))]
    {
        builtin_status_str(status).to_string()
    }
}

/// rdma-core's text for each status, for builds without libibverbs.
pub fn builtin_status_str(status: u32) -> &'static str {
    use code::*;
    match status {
        SUCCESS => "success",
        LOC_LEN_ERR => "local length error",
        LOC_QP_OP_ERR => "local QP operation error",
        LOC_EEC_OP_ERR => "local EE context operation error",
        LOC_PROT_ERR => "local protection error",
        WR_FLUSH_ERR => "Work Request Flushed Error",
        MW_BIND_ERR => "memory management operation error",
        BAD_RESP_ERR => "bad response error",
        LOC_ACCESS_ERR => "local access error",
        REM_INV_REQ_ERR => "remote invalid request error",
        REM_ACCESS_ERR => "remote access error",
        REM_OP_ERR => "remote operation error",
        RETRY_EXC_ERR => "transport retry counter exceeded",
        RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        LOC_RDD_VIOL_ERR => "local RDD violation error",
        REM_INV_RD_REQ_ERR => "remote invalid RD request",
        REM_ABORT_ERR => "aborted error",
        INV_EECN_ERR => "invalid EE context number",
        INV_EEC_STATE_ERR => "invalid EE context state",
        FATAL_ERR => "fatal error",
        RESP_TIMEOUT_ERR => "response timeout error",
        GENERAL_ERR => "general error",
        TM_ERR => "TM error",
        TM_RNDV_INCOMPLETE => "TM software rendezvous",
        _ => "unknown",
    }
}

/// A failed completion's status in words: the C name, `ibv_wc_status_str`'s
/// text and, for the common ones, what to check.
pub fn describe(status: u32) -> String {
    let name = status_name(status).map_or_else(|| format!("status {status}"), str::to_string);
    let text = status_str(status);
    match advice(status) {
        Some(a) => format!("{name} ({text}): {a}"),
        None => format!("{name} ({text})"),
    }
}

#[cfg(test)]
mod tests {
    use super::code::*;
    use super::*;

    #[test]
    fn the_common_failures_carry_advice() {
        assert_eq!(
            describe(RETRY_EXC_ERR),
            "IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded): peer unreachable or GID/MTU mismatch: check GW_IB_GID_INDEX and that both ports are ACTIVE"
        );
        assert_eq!(
            describe(REM_ACCESS_ERR),
            "IBV_WC_REM_ACCESS_ERR (remote access error): remote key or address wrong"
        );
        assert_eq!(
            describe(RNR_RETRY_EXC_ERR),
            "IBV_WC_RNR_RETRY_EXC_ERR (RNR retry counter exceeded): peer had no receive posted"
        );
        assert!(describe(WR_FLUSH_ERR).contains("an earlier completion"));
    }

    #[test]
    fn others_are_named_by_ibv_wc_status_str() {
        assert_eq!(
            describe(LOC_PROT_ERR),
            "IBV_WC_LOC_PROT_ERR (local protection error)"
        );
        assert_eq!(describe(GENERAL_ERR), "IBV_WC_GENERAL_ERR (general error)");
        for s in 0..=TM_RNDV_INCOMPLETE {
            let name = status_name(s).unwrap();
            assert!(describe(s).starts_with(name));
            assert!(describe(s).contains(&format!("({})", status_str(s))));
        }
    }

    #[test]
    fn unknown_statuses_are_numbered() {
        assert_eq!(status_name(99), None);
        assert_eq!(advice(99), None);
        assert!(describe(99).starts_with("status 99 ("), "{}", describe(99));
        assert_eq!(builtin_status_str(99), "unknown");
    }

    /// Where libibverbs is linked, its table and the built-in copy agree.
    #[cfg(feature = "verbs")]
    #[test]
    fn builtin_table_matches_libibverbs() {
        for s in 0..=TM_RNDV_INCOMPLETE {
            assert_eq!(status_str(s), builtin_status_str(s), "status {s}");
        }
    }
}
