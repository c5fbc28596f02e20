//! The collective test matrix, as run inside one launched job: every
//! collective × dtype × operator × count × placement, each checked exactly
//! against a sequential reference computed here from every rank's input.
//!
//! Inputs are small integers (0..=3, or 1..=2 for products), so sums,
//! products, extrema and averages are exact in every dtype, f16 and bf16
//! included, and any wrong element is a real error, not rounding.

use gw_collectives::{Communicator, DType, OpKind, RawOp, RedOp};
use half::{bf16, f16};

/// Every input repeats with this period in the element index (it depends on
/// `i % 7` and `(i / 7) % 4`; products on `i % 2`), and so does every
/// reference result. A case's buffers are therefore filled and checked one
/// tile of reference values at a time, by copy and compare: evaluating the
/// reference per element was three quarters of the matrix's run time at
/// 1 Mi elements, and the test's time is the CI's.
pub const PERIOD: usize = 28;

/// Elements in a tile: whole periods, a few KiB in every dtype.
const TILE_ELEMS: usize = PERIOD * 32;
const _: () = assert!(TILE_ELEMS.is_multiple_of(PERIOD));

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

/// The reference values of elements `start..start + elems` (at most one
/// tile), encoded as `dtype`; repeated, they give every later element too.
/// Every value must survive the encoding exactly, or a check against the
/// tile would compare with a rounded reference.
pub fn tile(dtype: DType, start: usize, elems: usize, value: impl Fn(usize) -> f64) -> Vec<u8> {
    let elems = elems.min(TILE_ELEMS);
    let mut t = vec![0u8; elems * dtype.size()];
    for k in 0..elems {
        let v = value(start + k);
        put(dtype, &mut t, k, v);
        assert_eq!(
            get(dtype, &t, k),
            v,
            "{dtype:?} cannot hold reference {v} exactly"
        );
    }
    t
}

/// Writes `tile` over `buf` again and again. The tile is [`tile`]'s for a
/// buffer of this length: all of it, or whole periods.
pub fn fill_tiled(buf: &mut [u8], tile: &[u8]) {
    for chunk in buf.chunks_mut(tile.len().max(1)) {
        chunk.copy_from_slice(&tile[..chunk.len()]);
    }
}

/// How many `dtype` elements of `buf` differ in value from `tile` repeated
/// (a tile as for [`fill_tiled`]).
/// Equal bytes are equal values (the references are never NaN), so only a
/// chunk that differs is decoded.
pub fn wrong_tiled(dtype: DType, buf: &[u8], tile: &[u8]) -> usize {
    let es = dtype.size();
    buf.chunks(tile.len().max(1))
        .map(|chunk| {
            let want = &tile[..chunk.len()];
            if chunk == want {
                return 0;
            }
            (0..chunk.len() / es)
                .filter(|&k| get(dtype, chunk, k) != get(dtype, want, k))
                .count()
        })
        .sum()
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
    let mine = tile(c.dtype, 0, send_elems, |i| input(me, i, c.op));
    let fill = |buf: &mut [u8], base: usize| {
        // For reduce-scatter the input index is global; all-gather fills this rank's chunk.
        fill_tiled(&mut buf[base * es..(base + send_elems) * es], &mine);
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
    let (dt, op, count) = (c.dtype, c.op, c.count);
    // The `count` elements from element `at` of the output, against the
    // reference `value` of elements `start..`.
    let check = |at: usize, start: usize, value: &dyn Fn(usize) -> f64| {
        wrong_tiled(
            dt,
            &out[at * es..(at + count) * es],
            &tile(dt, start, count, value),
        )
    };
    let wrong = match c.kind {
        OpKind::AllReduce => check(0, 0, &|i| expected(dt, op, n, i, w)),
        OpKind::Reduce if me == c.root => check(0, 0, &|i| expected(dt, op, n, i, None)),
        OpKind::ReduceScatter => {
            let off = if c.in_place { me as usize * count } else { 0 };
            check(off, me as usize * count, &|gi| {
                expected(dt, op, n, gi, None)
            })
        }
        OpKind::AllGather => (0..n)
            .map(|r| check(r as usize * count, 0, &|i| input(r, i, op)))
            .sum(),
        OpKind::Broadcast => check(0, 0, &|i| input(c.root, i, op)),
        _ => 0,
    };
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
    fn inputs_and_references_repeat_with_the_period() {
        for op in RedOp::ALL {
            for n in 1..=8 {
                for i in 0..3 * PERIOD {
                    for r in 0..n {
                        assert_eq!(
                            input(r, i + PERIOD, op),
                            input(r, i, op),
                            "{op:?} r={r} i={i}"
                        );
                    }
                    let w = [0.5, 0.25, 1.0, 2.0, 0.5, 0.25, 1.0, 2.0];
                    assert_eq!(
                        expected(DType::F32, op, n, i + PERIOD, Some(&w)),
                        expected(DType::F32, op, n, i, Some(&w)),
                    );
                }
            }
        }
    }

    #[test]
    fn a_tiled_check_counts_every_wrong_element_wherever_it_is() {
        for dtype in DType::ALL {
            let es = dtype.size();
            // Not a whole number of tiles: the last chunk is partial.
            let elems = 3 * TILE_ELEMS + 5;
            let value = |i: usize| input(2, i, RedOp::Sum);
            let t = tile(dtype, 11, elems, value);
            let mut buf = vec![0u8; elems * es];
            fill_tiled(&mut buf, &t);
            for i in 0..elems {
                assert_eq!(get(dtype, &buf, i), value(11 + i), "{dtype:?} element {i}");
            }
            assert_eq!(wrong_tiled(dtype, &buf, &t), 0);
            // One wrong element in the first tile, two in the partial one.
            for i in [7, elems - 4, elems - 1] {
                put(dtype, &mut buf, i, value(11 + i) + 1.0);
            }
            assert_eq!(wrong_tiled(dtype, &buf, &t), 3, "{dtype:?}");
            // A short buffer uses the start of the tile.
            let short = &buf[..(TILE_ELEMS / 2) * es];
            assert_eq!(wrong_tiled(dtype, short, &t), 1, "{dtype:?}");
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
