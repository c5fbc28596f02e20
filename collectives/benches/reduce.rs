//! Reduction-kernel throughput: the kernels (AVX2 and portable) against a
//! naive scalar loop with the same semantics.
//!
//! `cargo bench -p gw-collectives --bench reduce [-- SIZE_KIB]` (default 1024:
//! 1 MiB per buffer). Variants are interleaved round by round so that
//! frequency and cache drift hit them alike; each figure is the median of the
//! rounds. GB/s counts every byte touched: two buffers read, one written.

use gw_collectives::reduce::{Isa, Kernel};
use gw_collectives::{DType, RedOp};
use half::bf16;
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 41;
const REPS: usize = 4;

/// The naive loop for f32 sum. Volatile loads stop LLVM from vectorising it:
/// this is what one element at a time costs.
///
/// # Safety
/// `a` and `b` valid for `n` reads, `d` for `n` writes (`d` may equal `a`).
unsafe fn naive_f32_sum(d: *mut f32, a: *const f32, b: *const f32, n: usize) {
    for i in 0..n {
        // SAFETY: in bounds (caller); unaligned-safe because the bench
        // buffers are `Vec<f32>`.
        unsafe {
            d.add(i)
                .write(a.add(i).read_volatile() + b.add(i).read_volatile())
        };
    }
}

/// The naive loop for bf16 sum through `half`'s per-element conversions.
///
/// # Safety
/// As [`naive_f32_sum`].
unsafe fn naive_bf16_sum(d: *mut bf16, a: *const bf16, b: *const bf16, n: usize) {
    for i in 0..n {
        // SAFETY: in bounds (caller).
        unsafe {
            let (x, y) = (a.add(i).read_volatile(), b.add(i).read_volatile());
            d.add(i).write(bf16::from_f32(x.to_f32() + y.to_f32()));
        }
    }
}

type Variant<'a> = (&'a str, Box<dyn FnMut() + 'a>);

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the variants interleaved and prints GB/s per variant.
fn compare(title: &str, bytes_touched: usize, mut variants: Vec<Variant<'_>>) {
    let mut times = vec![Vec::with_capacity(ROUNDS); variants.len()];
    for (_, f) in variants.iter_mut() {
        f(); // warm-up: page faults, caches
    }
    for _ in 0..ROUNDS {
        for (i, (_, f)) in variants.iter_mut().enumerate() {
            let t = Instant::now();
            for _ in 0..REPS {
                f();
            }
            times[i].push(t.elapsed().as_secs_f64() / REPS as f64);
        }
    }
    println!("{title}");
    let meds: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
    let base = meds[0];
    for ((name, _), &t) in variants.iter().zip(&meds) {
        println!(
            "  {name:<28} {:>9.1} us {:>8.2} GB/s {:>6.2}x",
            t * 1e6,
            bytes_touched as f64 / t / 1e9,
            base / t
        );
    }
}

fn main() {
    let kib: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|i| i.is_available())
        .collect();
    println!(
        "reduce kernels: {kib} KiB per buffer, median of {ROUNDS} interleaved rounds, best ISA {}",
        Isa::detect().name()
    );

    // f32 sum, three distinct operands and in place (dst == a).
    let n = kib * 1024 / 4;
    let k = Kernel::new(DType::F32, RedOp::Sum, 2).unwrap();
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let d = std::cell::RefCell::new(vec![0f32; n]);
    let acc = std::cell::RefCell::new(a.clone());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());

    let mut v: Vec<Variant<'_>> = vec![(
        "naive scalar loop",
        Box::new(|| {
            // SAFETY: three distinct n-element buffers.
            unsafe { naive_f32_sum(d.borrow_mut().as_mut_ptr(), pa, pb, n) };
            black_box(&d);
        }),
    )];
    for &isa in &isas {
        let name = if isa == Isa::Avx2 {
            "kernel avx2"
        } else {
            "kernel portable (sse2)"
        };
        let d = &d;
        v.push((
            name,
            Box::new(move || {
                // SAFETY: three distinct n-element buffers.
                unsafe {
                    k.reduce_with(
                        isa,
                        d.borrow_mut().as_mut_ptr().cast(),
                        pa.cast(),
                        None,
                        pb.cast(),
                        None,
                        n,
                        false,
                    )
                };
                black_box(d);
            }),
        ));
    }
    compare("f32 sum, dst = a + b (3 operands)", 3 * n * 4, v);

    let mut v: Vec<Variant<'_>> = vec![(
        "naive scalar loop",
        Box::new(|| {
            let p = acc.borrow_mut().as_mut_ptr();
            // SAFETY: `p` and `pb` are distinct n-element buffers; dst == a.
            unsafe { naive_f32_sum(p, p, pb, n) };
            black_box(&acc);
        }),
    )];
    for &isa in &isas {
        let name = if isa == Isa::Avx2 {
            "kernel avx2"
        } else {
            "kernel portable (sse2)"
        };
        let acc = &acc;
        v.push((
            name,
            Box::new(move || {
                let p = acc.borrow_mut().as_mut_ptr().cast::<u8>();
                // SAFETY: as above.
                unsafe { k.reduce_with(isa, p, p, None, pb.cast(), None, n, false) };
                black_box(acc);
            }),
        ));
    }
    compare("f32 sum, a += b (in place)", 3 * n * 4, v);

    // Weighted average, the Cannikin step: a = (w·a + b) / n, in place.
    let kavg = Kernel::new(DType::F32, RedOp::Avg, 4).unwrap();
    let mut v: Vec<Variant<'_>> = Vec::new();
    for &isa in &isas {
        let name = if isa == Isa::Avx2 {
            "kernel avx2"
        } else {
            "kernel portable (sse2)"
        };
        let acc = &acc;
        v.push((
            name,
            Box::new(move || {
                let p = acc.borrow_mut().as_mut_ptr().cast::<u8>();
                // SAFETY: as above.
                unsafe { kavg.reduce_with(isa, p, p, Some(0.37), pb.cast(), None, n, true) };
                black_box(acc);
            }),
        ));
    }
    compare(
        "f32 avg, a = (0.37·a + b) / 4 (in place, finalize)",
        3 * n * 4,
        v,
    );

    // bf16 sum, three operands: the f32 staging path.
    let n = kib * 1024 / 2;
    let kb = Kernel::new(DType::Bf16, RedOp::Sum, 2).unwrap();
    let a: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32((i % 1000) as f32 * 0.25))
        .collect();
    let b: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32(1.0 - (i % 777) as f32))
        .collect();
    let d = std::cell::RefCell::new(vec![bf16::ZERO; n]);
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut v: Vec<Variant<'_>> = vec![(
        "naive scalar loop (half)",
        Box::new(|| {
            // SAFETY: three distinct n-element buffers.
            unsafe { naive_bf16_sum(d.borrow_mut().as_mut_ptr(), pa, pb, n) };
            black_box(&d);
        }),
    )];
    for &isa in &isas {
        let name = if isa == Isa::Avx2 {
            "kernel avx2"
        } else {
            "kernel portable (sse2)"
        };
        let d = &d;
        v.push((
            name,
            Box::new(move || {
                // SAFETY: three distinct n-element buffers.
                unsafe {
                    kb.reduce_with(
                        isa,
                        d.borrow_mut().as_mut_ptr().cast(),
                        pa.cast(),
                        None,
                        pb.cast(),
                        None,
                        n,
                        false,
                    )
                };
                black_box(d);
            }),
        ));
    }
    compare("bf16 sum, dst = a + b (3 operands)", 3 * n * 2, v);

    // f16 sum, three operands: F16C conversions.
    let kh = Kernel::new(DType::F16, RedOp::Sum, 2).unwrap();
    let a: Vec<half::f16> = (0..n)
        .map(|i| half::f16::from_f32((i % 1000) as f32 * 0.25))
        .collect();
    let b: Vec<half::f16> = (0..n)
        .map(|i| half::f16::from_f32(1.0 - (i % 777) as f32))
        .collect();
    let d = std::cell::RefCell::new(vec![half::f16::ZERO; n]);
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut v: Vec<Variant<'_>> = vec![(
        "naive scalar loop (half)",
        Box::new(|| {
            let mut d = d.borrow_mut();
            for i in 0..n {
                // SAFETY: in bounds.
                let (x, y) = unsafe { (pa.add(i).read_volatile(), pb.add(i).read_volatile()) };
                d[i] = half::f16::from_f32(x.to_f32() + y.to_f32());
            }
            black_box(&d);
        }),
    )];
    for &isa in &isas {
        let name = if isa == Isa::Avx2 {
            "kernel avx2"
        } else {
            "kernel portable (sse2)"
        };
        let d = &d;
        v.push((
            name,
            Box::new(move || {
                // SAFETY: three distinct n-element buffers.
                unsafe {
                    kh.reduce_with(
                        isa,
                        d.borrow_mut().as_mut_ptr().cast(),
                        pa.cast(),
                        None,
                        pb.cast(),
                        None,
                        n,
                        false,
                    )
                };
                black_box(d);
            }),
        ));
    }
    compare("f16 sum, dst = a + b (3 operands)", 3 * n * 2, v);
}
