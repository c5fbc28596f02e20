//! The data-plane frame header and the operation fingerprint it carries.
//!
//! Every segment that crosses a transport starts with a fixed 64-byte header.
//! Besides placement (`offset`, `len`) it names the operation that produced it
//! (communicator, sequence number, op, dtype, reduction, count, root). A
//! receiver compares that fingerprint with the operation it is running and turns
//! any disagreement into an error naming both sides' calls: the most common way
//! collective libraries hang or silently corrupt data is ranks that disagree.
//!
//! The codec is pure (no I/O) and total: any 64 bytes decode to a header or to
//! an error, never a panic.

use crate::error::{Error, Result};
use std::fmt;

/// Size of an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"GWF1");

/// Element types, numbered as in the C ABI (`gwDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    U8 = 0,
    I32 = 1,
    I64 = 2,
    F16 = 3,
    Bf16 = 4,
    F32 = 5,
    F64 = 6,
    /// Untyped bytes (point-to-point transfers, all-gather of opaque data).
    Bytes = 255,
}

impl DType {
    /// Every reducible type, in C ABI order.
    pub const ALL: [DType; 7] = [
        DType::U8,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::Bytes => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Decodes the wire / C ABI code.
    pub fn from_code(c: u8) -> Option<DType> {
        Some(match c {
            0 => DType::U8,
            1 => DType::I32,
            2 => DType::I64,
            3 => DType::F16,
            4 => DType::Bf16,
            5 => DType::F32,
            6 => DType::F64,
            255 => DType::Bytes,
            _ => return None,
        })
    }

    /// The name nccl-tests prints for this type.
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "half",
            DType::Bf16 => "bfloat16",
            DType::F32 => "float",
            DType::F64 => "double",
            DType::Bytes => "bytes",
        }
    }

    /// Parses a nccl-tests type name or a Rust-style alias.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" | "int" => DType::I32,
            "int64" | "i64" => DType::I64,
            "half" | "f16" | "float16" => DType::F16,
            "bfloat16" | "bf16" => DType::Bf16,
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "bytes" => DType::Bytes,
            _ => return None,
        })
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::Bf16 | DType::F32 | DType::F64)
    }
}

/// Reduction operators, numbered as in the C ABI (`gwRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Min = 2,
    Max = 3,
    Avg = 4,
    /// No reduction (broadcast, all-gather, point-to-point).
    None = 255,
}

impl RedOp {
    /// Every reduction operator, in C ABI order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];

    /// Decodes the wire / C ABI code.
    pub fn from_code(c: u8) -> Option<RedOp> {
        Some(match c {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Min,
            3 => RedOp::Max,
            4 => RedOp::Avg,
            255 => RedOp::None,
            _ => return None,
        })
    }

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
            RedOp::Avg => "avg",
            RedOp::None => "none",
        }
    }

    /// Parses an operator name.
    pub fn parse(s: &str) -> Option<RedOp> {
        Some(match s {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "min" => RedOp::Min,
            "max" => RedOp::Max,
            "avg" => RedOp::Avg,
            _ => return None,
        })
    }
}

/// What kind of operation a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    SendRecv = 1,
    AllReduce = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    Reduce = 6,
    Barrier = 7,
}

impl OpKind {
    /// Decodes the wire code.
    pub fn from_code(c: u8) -> Option<OpKind> {
        Some(match c {
            1 => OpKind::SendRecv,
            2 => OpKind::AllReduce,
            3 => OpKind::ReduceScatter,
            4 => OpKind::AllGather,
            5 => OpKind::Broadcast,
            6 => OpKind::Reduce,
            7 => OpKind::Barrier,
            _ => return None,
        })
    }

    /// The API name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::SendRecv => "send/recv",
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
        }
    }
}

/// Identifies one collective call: every rank taking part computes the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub comm_id: u64,
    pub seq: u64,
    pub op: OpKind,
    pub dtype: DType,
    pub redop: RedOp,
    pub count: u64,
    pub root: u32,
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(seq={}, count={}, dtype={}",
            self.op.name(),
            self.seq,
            self.count,
            self.dtype.name()
        )?;
        if self.redop != RedOp::None {
            write!(f, ", op={}", self.redop.name())?;
        }
        if matches!(self.op, OpKind::Broadcast | OpKind::Reduce) {
            write!(f, ", root={}", self.root)?;
        }
        write!(f, ", comm={:#x})", self.comm_id)
    }
}

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A segment of a message.
    Data = 1,
    /// The sender failed; the payload is a UTF-8 message saying why.
    Abort = 2,
    /// The sender shut its communicator down cleanly; nothing follows.
    Close = 3,
    /// Shared memory only: the whole message waits in the sender's memory
    /// for the receiver to copy it out; the payload is its address and a
    /// completion number (see `shm/pull.rs`).
    Rendezvous = 4,
}

/// The fixed header in front of every segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub src_rank: u32,
    pub fp: Fingerprint,
    /// Algorithm step within the operation; together with `fp.seq` it names the message.
    pub step: u32,
    /// Byte offset of this segment within its message.
    pub offset: u64,
    /// Payload bytes following the header.
    pub len: u64,
    /// Total bytes of the message this segment belongs to.
    pub total: u64,
}

impl FrameHeader {
    /// Encodes into the 64-byte wire form (little endian).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.fp.op as u8;
        b[6] = self.fp.dtype as u8;
        b[7] = self.fp.redop as u8;
        b[8..12].copy_from_slice(&self.src_rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.fp.root.to_le_bytes());
        b[16..20].copy_from_slice(&self.step.to_le_bytes());
        // 20..24 reserved (zero)
        b[24..32].copy_from_slice(&self.fp.comm_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.fp.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.fp.count.to_le_bytes());
        b[48..56].copy_from_slice(&self.offset.to_le_bytes());
        // The payload length fits in 32 bits (segments are small); the total does not.
        let len32 = u32::try_from(self.len).unwrap_or(u32::MAX);
        b[56..60].copy_from_slice(&len32.to_le_bytes());
        // Total bytes: low 32 bits here, high 32 bits in the reserved word.
        b[60..64].copy_from_slice(&(self.total as u32).to_le_bytes());
        b[20..24].copy_from_slice(&((self.total >> 32) as u32).to_le_bytes());
        b
    }

    /// Decodes a header; any malformed input is a [`Error::Protocol`].
    pub fn decode(b: &[u8]) -> Result<FrameHeader> {
        if b.len() < HEADER_LEN {
            return Err(Error::Protocol(format!(
                "frame header too short: {} bytes, need {HEADER_LEN}",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(Error::Protocol(format!(
                "bad frame magic {magic:#010x} (expected {MAGIC:#010x}): the peer is not speaking gradwire's data protocol or the stream lost sync"
            )));
        }
        let kind = match b[4] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Close,
            4 => FrameKind::Rendezvous,
            k => return Err(Error::Protocol(format!("unknown frame kind {k}"))),
        };
        let op = OpKind::from_code(b[5])
            .ok_or_else(|| Error::Protocol(format!("unknown op code {}", b[5])))?;
        let dtype = DType::from_code(b[6])
            .ok_or_else(|| Error::Protocol(format!("unknown dtype code {}", b[6])))?;
        let redop = RedOp::from_code(b[7])
            .ok_or_else(|| Error::Protocol(format!("unknown reduction code {}", b[7])))?;
        let len = u32_at(56) as u64;
        let total = ((u32_at(20) as u64) << 32) | u32_at(60) as u64;
        let offset = u64_at(48);
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(Error::Protocol(format!(
                "segment [{offset}, +{len}) lies outside its {total}-byte message"
            )));
        }
        Ok(FrameHeader {
            kind,
            src_rank: u32_at(8),
            fp: Fingerprint {
                comm_id: u64_at(24),
                seq: u64_at(32),
                op,
                dtype,
                redop,
                count: u64_at(40),
                root: u32_at(12),
            },
            step: u32_at(16),
            offset,
            len,
            total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_header() -> impl Strategy<Value = FrameHeader> {
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            1u8..=7,
            prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 255]),
            prop::sample::select(vec![0u8, 1, 2, 3, 4, 255]),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
        )
            .prop_map(
                |(src, comm, seq, op, dt, ro, count, root, step, total, len, _abort)| {
                    let len = (len as u64).min(total);
                    let offset = (total - len) / 2;
                    FrameHeader {
                        kind: [
                            FrameKind::Data,
                            FrameKind::Abort,
                            FrameKind::Close,
                            FrameKind::Rendezvous,
                        ][(step % 4) as usize],
                        src_rank: src,
                        fp: Fingerprint {
                            comm_id: comm,
                            seq,
                            op: OpKind::from_code(op).unwrap(),
                            dtype: DType::from_code(dt).unwrap(),
                            redop: RedOp::from_code(ro).unwrap(),
                            count,
                            root,
                        },
                        step,
                        offset,
                        len,
                        total,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn roundtrip(h in arb_header()) {
            let enc = h.encode();
            prop_assert_eq!(FrameHeader::decode(&enc).unwrap(), h);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = FrameHeader::decode(&bytes);
        }

        #[test]
        fn corrupted_headers_never_panic(h in arb_header(), i in 0usize..HEADER_LEN, v in any::<u8>()) {
            let mut enc = h.encode();
            enc[i] = v;
            if let Ok(d) = FrameHeader::decode(&enc) {
                prop_assert!(d.offset + d.len <= d.total);
            }
        }
    }

    #[test]
    fn bad_magic_is_named() {
        let e = FrameHeader::decode(&[0u8; HEADER_LEN]).unwrap_err();
        assert!(e.to_string().contains("bad frame magic"), "{e}");
    }

    #[test]
    fn fingerprint_display_names_the_call() {
        let fp = Fingerprint {
            comm_id: 1,
            seq: 7,
            op: OpKind::Broadcast,
            dtype: DType::F32,
            redop: RedOp::None,
            count: 10,
            root: 3,
        };
        assert_eq!(
            fp.to_string(),
            "broadcast(seq=7, count=10, dtype=float, root=3, comm=0x1)"
        );
    }
}
