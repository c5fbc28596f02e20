//! The collective test matrix, as run inside one launched job: every
//! collective × dtype × operator × count × placement, each checked exactly
//! against a sequential reference computed here from every rank's input.
//!
//! Inputs are small integers (0..=3, or 1..=2 for products), so sums,
//! products, extrema and averages are exact in every dtype, f16 and bf16
//! included, and any wrong element is a real error, not rounding.

use gw_collectives::{Communicator, DType, OpKind, RawOp, RedOp};
use half::{bf16, f16};

/// The value rank `r` contributes at element `i` for operator `op`.
pub fn input(r: u32, i: usize, op: RedOp) -> f64 {
    if op == RedOp::Prod {
        1.0 + ((r as usize + i) % 2) as f64
    } else {
        (((r as usize + 1) * (i % 7 + 1) + i / 7) % 4) as f64
    }
}

/// Encodes a small integer-valued `v` as `dtype` into `out`.
pub fn put(dtype: DType, out: &mut [u8], i: usize, v: f64) {
    let es = dtype.size();
    let b = &mut out[i * es..(i + 1) * es];
    match dtype {
        DType::U8 | DType::Bytes => b[0] = v as i64 as u8,
        DType::I32 => b.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => b.copy_from_slice(&(v as i64).to_le_bytes()),
        DType::F16 => b.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::Bf16 => b.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::F32 => b.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => b.copy_from_slice(&v.to_le_bytes()),
    }
}

/// Decodes element `i` of `buf` as `dtype`.
pub fn get(dtype: DType, buf: &[u8], i: usize) -> f64 {
    let es = dtype.size();
    let b = &buf[i * es..(i + 1) * es];
    match dtype {
        DType::U8 | DType::Bytes => b[0] as f64,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::I64 => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

/// The exact reduction of every rank's input at element `i`, as the library
/// must compute it (u8 wraps; avg divides the exact sum once, in the
/// precision the kernels use for that dtype; weights are powers of two).
pub fn expected(dtype: DType, op: RedOp, n: u32, i: usize, weights: Option<&[f64]>) -> f64 {
    let val = |r: u32| input(r, i, op) * weights.map_or(1.0, |w| w[r as usize]);
    let v = match op {
        RedOp::Sum | RedOp::Avg => (0..n).map(val).sum(),
        RedOp::Prod => (0..n).map(val).product(),
        RedOp::Min => (0..n).map(val).fold(f64::INFINITY, f64::min),
        RedOp::Max => (0..n).map(val).fold(f64::NEG_INFINITY, f64::max),
        RedOp::None => val(0),
    };
    let v = if dtype == DType::U8 {
        (v as i64).rem_euclid(256) as f64
    } else {
        v
    };
    if op == RedOp::Avg {
        match dtype {
            DType::F64 => v / n as f64,
            DType::F16 => f16::from_f32(v as f32 / n as f32).to_f64(),
            DType::Bf16 => bf16::from_f32(v as f32 / n as f32).to_f64(),
            _ => (v as f32 / n as f32) as f64,
        }
    } else {
        v
    }
}

/// An 8-byte-aligned byte buffer.
pub struct Bytes {
    words: Vec<u64>,
    len: usize,
}

impl Bytes {
    pub fn new(len: usize) -> Bytes {
        Bytes {
            words: vec![0; len.div_ceil(8).max(1)],
            len,
        }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the words hold at least len bytes; u8 has no invalid values.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
    pub fn ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }
}

/// One case of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: OpKind,
    pub dtype: DType,
    pub op: RedOp,
    pub count: usize,
    pub root: u32,
    pub in_place: bool,
    pub weighted: bool,
}

/// Runs one case and returns the number of wrong elements on this rank.
pub fn run_case(comm: &Communicator, c: &Case) -> Result<usize, String> {
    let (me, n) = (comm.rank(), comm.size());
    let es = c.dtype.size();
    let (send_elems, recv_elems) = match c.kind {
        OpKind::ReduceScatter => (c.count * n as usize, c.count),
        OpKind::AllGather => (c.count, c.count * n as usize),
        _ => (c.count, c.count),
    };
    // In-place layouts: one buffer, of the larger size.
    let mut sendb = Bytes::new(send_elems * es);
    let mut recvb = Bytes::new(recv_elems.max(send_elems) * es);
    let sbase = match c.kind {
        OpKind::AllGather => me as usize * c.count,
        _ => 0,
    };
    let weights: Vec<f64> = (0..n)
        .map(|r| [0.5, 0.25, 1.0, 2.0][r as usize % 4])
        .collect();
    let fill = |buf: &mut [u8], base: usize| {
        for i in 0..send_elems {
            // For reduce-scatter the input index is global; all-gather fills this rank's chunk.
            put(c.dtype, buf, base + i, input(me, i, c.op));
        }
    };
    if c.in_place {
        let base = sbase;
        fill(recvb.as_mut_slice(), base);
    } else {
        fill(sendb.as_mut_slice(), 0);
    }
    let (send_ptr, recv_ptr): (*const u8, *mut u8) = if c.in_place {
        let p = recvb.ptr();
        match c.kind {
            // SAFETY: the chunk offsets stay within the n·count buffer.
            OpKind::AllGather => (unsafe { p.add(sbase * es) }, p),
            OpKind::ReduceScatter => (p, unsafe { p.add(me as usize * c.count * es) }),
            _ => (p, p),
        }
    } else {
        (sendb.ptr(), recvb.ptr())
    };
    let raw = RawOp {
        kind: c.kind,
        dtype: c.dtype,
        redop: c.op,
        count: c.count,
        root: c.root,
        send: send_ptr,
        recv: recv_ptr,
        weight: c.weighted.then(|| weights[me as usize]),
    };
    // SAFETY: both buffers are sized for the layout and outlive the wait.
    unsafe { comm.submit_raw(raw, None) }
        .and_then(|h| h.wait())
        .map_err(|e| format!("{c:?}: {e}"))?;
    let out = recvb.as_slice();
    let w = c.weighted.then_some(weights.as_slice());
    let mut wrong = 0;
    match c.kind {
        OpKind::AllReduce => {
            for i in 0..c.count {
                wrong += (get(c.dtype, out, i) != expected(c.dtype, c.op, n, i, w)) as usize;
            }
        }
        OpKind::Reduce if me == c.root => {
            for i in 0..c.count {
                wrong += (get(c.dtype, out, i) != expected(c.dtype, c.op, n, i, None)) as usize;
            }
        }
        OpKind::ReduceScatter => {
            let off = if c.in_place { me as usize * c.count } else { 0 };
            for i in 0..c.count {
                let gi = me as usize * c.count + i;
                wrong +=
                    (get(c.dtype, out, off + i) != expected(c.dtype, c.op, n, gi, None)) as usize;
            }
        }
        OpKind::AllGather => {
            for r in 0..n {
                for i in 0..c.count {
                    wrong +=
                        (get(c.dtype, out, r as usize * c.count + i) != input(r, i, c.op)) as usize;
                }
            }
        }
        OpKind::Broadcast => {
            for i in 0..c.count {
                wrong += (get(c.dtype, out, i) != input(c.root, i, c.op)) as usize;
            }
        }
        _ => {}
    }
    Ok(wrong)
}

/// Every case of the matrix for these counts, in a fixed order all ranks share.
pub fn matrix(n: u32, counts: &[usize]) -> Vec<Case> {
    let mut cases = Vec::new();
    let kinds = [
        OpKind::AllReduce,
        OpKind::ReduceScatter,
        OpKind::AllGather,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::Barrier,
    ];
    let mut k = 0u32;
    for &count in counts {
        for kind in kinds {
            for dtype in DType::ALL {
                let reducing = matches!(
                    kind,
                    OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
                );
                let ops: &[RedOp] = if reducing { &RedOp::ALL } else { &[RedOp::Sum] };
                for &op in ops {
                    if op == RedOp::Avg && !dtype.is_float() {
                        continue; // refused by design; tested separately
                    }
                    for in_place in [false, true] {
                        k += 1;
                        let weighted = kind == OpKind::AllReduce
                            && op == RedOp::Sum
                            && dtype.is_float()
                            && k.is_multiple_of(2);
                        cases.push(Case {
                            kind,
                            dtype,
                            op,
                            count,
                            root: k % n,
                            in_place,
                            weighted,
                        });
                    }
                    if kind == OpKind::Barrier {
                        break;
                    }
                }
                if kind == OpKind::Barrier {
                    break;
                }
            }
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_is_exact_in_every_dtype() {
        for dtype in DType::ALL {
            for op in RedOp::ALL {
                for n in 1..=8 {
                    for i in 0..50 {
                        let v = expected(dtype, op, n, i, None);
                        let mut b = vec![0u8; 8];
                        put(dtype, &mut b, 0, v);
                        if op != RedOp::Avg {
                            assert_eq!(get(dtype, &b, 0), v, "{dtype:?} {op:?} n={n} i={i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matrix_covers_every_collective_dtype_and_op() {
        let m = matrix(4, &[0, 7]);
        for kind in [OpKind::AllReduce, OpKind::ReduceScatter, OpKind::Reduce] {
            for dtype in DType::ALL {
                for op in RedOp::ALL {
                    let want = op != RedOp::Avg || dtype.is_float();
                    let have = m
                        .iter()
                        .any(|c| c.kind == kind && c.dtype == dtype && c.op == op);
                    assert_eq!(have, want, "{kind:?} {dtype:?} {op:?}");
                }
            }
        }
        assert!(m.iter().any(|c| c.weighted));
        assert!(m.iter().any(|c| c.kind == OpKind::Barrier));
    }
}
