//! The collective vocabulary: element types, reduction operators, operation
//! kinds, and the fingerprint that names one collective call.
//!
//! The transports below carry a message's [`Tag`] without knowing what an
//! operation is; this module is where a fingerprint becomes a tag (its kind,
//! type, reduction, root and count packed into the tag's opaque
//! [`Signature`]) and where a tag is printed back as a call
//! (`all_reduce(seq=4, count=10, dtype=float, op=sum, comm=0x1)`), so that a
//! disagreement found by any transport names both calls in these words.

use gw_transport::{Scope, Signature, Tag};
use std::fmt;

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
        // Messages share one sequence number (see `P2P_SEQ`): it says nothing.
        if self.is_message() {
            write!(f, "{}(dtype={}", self.op.name(), self.dtype.name())?;
        } else {
            write!(
                f,
                "{}(seq={}, count={}, dtype={}",
                self.op.name(),
                self.seq,
                self.count,
                self.dtype.name()
            )?;
        }
        if self.redop != RedOp::None {
            write!(f, ", op={}", self.redop.name())?;
        }
        if matches!(self.op, OpKind::Broadcast | OpKind::Reduce) {
            write!(f, ", root={}", self.root)?;
        }
        write!(f, ", comm={:#x})", self.comm_id)
    }
}

/// Signature layout: kind, type, reduction (one byte each), root (4 bytes),
/// element count (5 bytes: 2^40 elements, 4 TiB of f32, more than any one
/// collective carries; a larger count is refused when the call is checked).
const COUNT_BYTES: usize = Signature::LEN - 7;

/// The largest element count a signature can carry.
pub const MAX_COUNT: u64 = (1 << (8 * COUNT_BYTES)) - 1;

/// The sequence number of every point-to-point message (they are told apart
/// by their per-pair step instead), chosen so that it can never be mistaken
/// for a collective's.
pub(crate) const P2P_SEQ: u64 = u64::MAX;

impl Fingerprint {
    /// Whether this is a point-to-point message (a send, a receive or both)
    /// rather than a step of the sequence every rank runs in one order: the
    /// engine runs these beside that sequence, not in it.
    pub(crate) fn is_message(&self) -> bool {
        self.op == OpKind::SendRecv && self.seq == P2P_SEQ
    }

    /// The tag of message `step` of this call.
    pub fn tag(&self, step: u32) -> Tag {
        let mut sig = [0u8; Signature::LEN];
        sig[0] = self.op as u8;
        sig[1] = self.dtype as u8;
        sig[2] = self.redop as u8;
        sig[3..7].copy_from_slice(&self.root.to_le_bytes());
        sig[7..].copy_from_slice(&self.count.to_le_bytes()[..COUNT_BYTES]);
        Tag {
            comm: self.comm_id,
            seq: self.seq,
            step,
            sig: Signature(sig),
            // Point-to-point messages share one slot and are told apart by
            // their step alone.
            scope: if self.op == OpKind::SendRecv {
                Scope::Message
            } else {
                Scope::Operation
            },
            show: show_tag,
        }
    }

    /// The call a tag describes, if its signature is one of ours.
    pub fn from_tag(t: &Tag) -> Option<Fingerprint> {
        let s = &t.sig.0;
        let mut count = [0u8; 8];
        count[..COUNT_BYTES].copy_from_slice(&s[7..]);
        Some(Fingerprint {
            comm_id: t.comm,
            seq: t.seq,
            op: OpKind::from_code(s[0])?,
            dtype: DType::from_code(s[1])?,
            redop: RedOp::from_code(s[2])?,
            root: u32::from_le_bytes([s[3], s[4], s[5], s[6]]),
            count: u64::from_le_bytes(count),
        })
    }
}

/// How every tag this layer makes is printed: as the call it came from.
fn show_tag(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match Fingerprint::from_tag(t) {
        Some(fp) => fmt::Display::fmt(&fp, f),
        None => write!(
            f,
            "an unknown operation (comm={:#x}, seq={}, signature {:02x?})",
            t.comm, t.seq, t.sig.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_fp() -> impl Strategy<Value = Fingerprint> {
        (
            any::<u64>(),
            any::<u64>(),
            1u8..=7,
            prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 255]),
            prop::sample::select(vec![0u8, 1, 2, 3, 4, 255]),
            0u64..=MAX_COUNT,
            any::<u32>(),
        )
            .prop_map(|(comm_id, seq, op, dt, ro, count, root)| Fingerprint {
                comm_id,
                seq,
                op: OpKind::from_code(op).unwrap(),
                dtype: DType::from_code(dt).unwrap(),
                redop: RedOp::from_code(ro).unwrap(),
                count,
                root,
            })
    }

    proptest! {
        #[test]
        fn a_fingerprint_survives_its_tag(fp in arb_fp(), step in any::<u32>()) {
            let t = fp.tag(step);
            prop_assert_eq!(t.step, step);
            prop_assert_eq!(Fingerprint::from_tag(&t), Some(fp));
            // Also after the trip over the wire, which forgets the printer.
            let raw = Tag::raw(t.comm, t.seq, t.step, t.sig, t.scope);
            prop_assert_eq!(Fingerprint::from_tag(&raw), Some(fp));
        }
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
        // A tag prints as its call.
        assert_eq!(fp.tag(2).to_string(), fp.to_string());
    }

    #[test]
    fn calls_that_differ_in_anything_have_different_signatures() {
        let base = Fingerprint {
            comm_id: 1,
            seq: 7,
            op: OpKind::AllReduce,
            dtype: DType::F32,
            redop: RedOp::Sum,
            count: 10,
            root: 0,
        };
        for other in [
            Fingerprint {
                op: OpKind::Reduce,
                ..base
            },
            Fingerprint {
                dtype: DType::F64,
                ..base
            },
            Fingerprint {
                redop: RedOp::Max,
                ..base
            },
            Fingerprint { count: 11, ..base },
            Fingerprint { root: 1, ..base },
        ] {
            assert_ne!(other.tag(0).sig, base.tag(0).sig, "{other}");
        }
    }
}
