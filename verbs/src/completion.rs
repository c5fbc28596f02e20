//! A work completion as the rest of gradwire sees it, and the byte order of
//! immediates.
//!
//! `struct ibv_wc` is a C struct with a union and fields that are valid only
//! for some opcodes or only on success; [`Completion::from_raw`] turns its
//! fields into a plain value (the immediate only where the `IBV_WC_WITH_IMM`
//! flag says there is one, in host order), so the conversion is tested
//! without a device and `cq.rs` only reads the struct.
//!
//! Immediates travel in network byte order: verbs carry `imm_data` as
//! `__be32`, and a peer of another endianness (or another verbs library)
//! reads it that way. [`imm_to_wire`] and [`imm_from_wire`] are the only
//! places the swap happens.

use crate::error::Error;
use crate::status;

/// `enum ibv_wc_opcode` codes.
pub mod code {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const BIND_MW: u32 = 5;
    pub const LOCAL_INV: u32 = 6;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `IBV_WC_WITH_IMM`, the `wc_flags` bit saying `imm_data` is valid.
pub const WC_WITH_IMM: u32 = 1 << 1;

/// What completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// A send (or a send's local completion).
    Send,
    /// A one-sided write's local completion (with or without immediate).
    RdmaWrite,
    RdmaRead,
    /// A posted receive that a send filled.
    Recv,
    /// A posted receive that a peer's RDMA WRITE WITH IMM consumed: the
    /// bytes are in the registered region it targeted, the immediate here.
    RecvRdmaWithImm,
    /// Any other code; also what failed completions carry, since their
    /// opcode is undefined.
    #[default]
    Other,
}

impl Opcode {
    pub fn from_code(code: u32) -> Opcode {
        match code {
            code::SEND => Opcode::Send,
            code::RDMA_WRITE => Opcode::RdmaWrite,
            code::RDMA_READ => Opcode::RdmaRead,
            code::RECV => Opcode::Recv,
            code::RECV_RDMA_WITH_IMM => Opcode::RecvRdmaWithImm,
            _ => Opcode::Other,
        }
    }
}

/// The fields of a `struct ibv_wc` that gradwire reads, as the struct holds
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub wc_flags: u32,
    /// `imm_data`, in network order.
    pub imm_be: u32,
    pub vendor_err: u32,
    pub qp_num: u32,
}

/// One entry of a completion queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The id the work request was posted with.
    pub wr_id: u64,
    pub opcode: Opcode,
    /// Bytes received (receives; for write-with-imm, the bytes written).
    pub byte_len: u32,
    /// The immediate, in host order, where the completion carries one.
    pub imm: Option<u32>,
    /// `enum ibv_wc_status`; 0 is success.
    pub status: u32,
    pub vendor_err: u32,
    /// The local queue pair it belongs to.
    pub qp_num: u32,
}

impl Completion {
    /// The completion whose `struct ibv_wc` fields are `raw`. On a failed
    /// completion only `wr_id`, `status`, `vendor_err` and `qp_num` are
    /// defined, so the rest are left empty.
    pub fn from_raw(raw: &RawWc) -> Completion {
        let RawWc {
            wr_id,
            status,
            opcode,
            byte_len,
            wc_flags,
            imm_be,
            vendor_err,
            qp_num,
        } = *raw;
        if status != status::code::SUCCESS {
            return Completion {
                wr_id,
                opcode: Opcode::Other,
                byte_len: 0,
                imm: None,
                status,
                vendor_err,
                qp_num,
            };
        }
        Completion {
            wr_id,
            opcode: Opcode::from_code(opcode),
            byte_len,
            imm: (wc_flags & WC_WITH_IMM != 0).then(|| imm_from_wire(imm_be)),
            status,
            vendor_err,
            qp_num,
        }
    }

    pub fn is_ok(&self) -> bool {
        self.status == status::code::SUCCESS
    }

    /// The completion, or the error its status means.
    pub fn ok(self) -> Result<Completion, Error> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Completion {
                wr_id: self.wr_id,
                status: self.status,
                vendor_err: self.vendor_err,
                text: format!(
                    "{} (vendor error {:#x}, queue pair {:#x})",
                    status::describe(self.status),
                    self.vendor_err,
                    self.qp_num
                ),
            })
        }
    }
}

/// An immediate as a work request carries it (`__be32`).
pub fn imm_to_wire(imm: u32) -> u32 {
    imm.to_be()
}

/// An immediate as a completion carries it, in host order.
pub fn imm_from_wire(wire: u32) -> u32 {
    u32::from_be(wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_travel_big_endian() {
        assert_eq!(imm_to_wire(0x0102_0304).to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(imm_from_wire(u32::from_ne_bytes([1, 2, 3, 4])), 0x0102_0304);
        for v in [0, 1, 0xdead_beef, u32::MAX] {
            assert_eq!(imm_from_wire(imm_to_wire(v)), v);
        }
    }

    #[test]
    fn a_write_with_imm_lands_with_its_immediate() {
        let wire = imm_to_wire(0xabcd_0001);
        let c = Completion::from_raw(&RawWc {
            wr_id: 7,
            opcode: code::RECV_RDMA_WITH_IMM,
            byte_len: 4096,
            wc_flags: WC_WITH_IMM,
            imm_be: wire,
            qp_num: 5,
            ..RawWc::default()
        });
        assert_eq!(
            c,
            Completion {
                wr_id: 7,
                opcode: Opcode::RecvRdmaWithImm,
                byte_len: 4096,
                imm: Some(0xabcd_0001),
                status: 0,
                vendor_err: 0,
                qp_num: 5,
            }
        );
        assert_eq!(c.ok().unwrap(), c);
    }

    #[test]
    fn no_flag_no_immediate() {
        let c = Completion::from_raw(&RawWc {
            wr_id: 1,
            opcode: code::RECV,
            byte_len: 10,
            imm_be: 0x1234,
            ..RawWc::default()
        });
        assert_eq!(c.opcode, Opcode::Recv);
        assert_eq!(c.imm, None);
        let c = Completion::from_raw(&RawWc {
            opcode: code::RDMA_WRITE,
            ..RawWc::default()
        });
        assert_eq!(c.opcode, Opcode::RdmaWrite);
        assert_eq!(Opcode::from_code(code::SEND), Opcode::Send);
        assert_eq!(Opcode::from_code(code::RDMA_READ), Opcode::RdmaRead);
        assert_eq!(Opcode::from_code(code::FETCH_ADD), Opcode::Other);
    }

    #[test]
    fn a_failed_completion_keeps_only_defined_fields() {
        let c = Completion::from_raw(&RawWc {
            wr_id: 9,
            status: status::code::RETRY_EXC_ERR,
            opcode: code::RECV_RDMA_WITH_IMM,
            byte_len: 999,
            wc_flags: WC_WITH_IMM,
            imm_be: 1,
            vendor_err: 0x81,
            qp_num: 0x2a,
        });
        assert_eq!(c.opcode, Opcode::Other);
        assert_eq!(c.imm, None);
        assert_eq!(c.byte_len, 0);
        assert!(!c.is_ok());
        let e = c.ok().unwrap_err();
        assert!(matches!(
            e,
            Error::Completion {
                wr_id: 9,
                status: 12,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "work request 9 failed: IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded): peer unreachable or GID/MTU mismatch: check GW_IB_GID_INDEX and that both ports are ACTIVE (vendor error 0x81, queue pair 0x2a)"
        );
    }
}
