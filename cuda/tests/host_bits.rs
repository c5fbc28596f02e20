//! The generated kernel source, compiled for the host with the system's
//! C++ compiler, gives the host path's results bit for bit: every dtype ×
//! operator, weighted or not, averaged or not, in place, on random bit
//! patterns (NaNs, infinities, subnormals and signed zeros included).
//!
//! The device compiles the same lines (the 16-bit conversions are the
//! source's own integer code, not CUDA intrinsics) with fused multiply-add
//! off, so what this checks is what the GPU computes, less the hardware's
//! IEEE operations themselves, which the GPU check covers
//! (`#[ignore]`d tests of the `cuda` work).

use gw_collectives::reduce::Kernel;
use gw_collectives::{DType, RedOp};
use gw_cuda::kernels::{self, Elem, Op};
use libloading::Library;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::process::Command;

/// The source built as a shared library for this machine.
fn host_library() -> Library {
    // The build's scratch directory, or (on a machine the test binary was
    // copied to, such as the GPU check's) the system's.
    let dir = Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let src = dir.join("gw_kernels_host.cpp");
    let so = dir.join(format!("libgw_kernels_host_{}.so", std::process::id()));
    std::fs::write(&src, kernels::source()).expect("write the source");
    // -ffp-contract=off: no fused multiply-add, as NVRTC's --fmad=false.
    let out = Command::new("c++")
        .args(["-std=c++11", "-O2", "-ffp-contract=off", "-fno-fast-math"])
        .args(["-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("running c++");
    assert!(
        out.status.success(),
        "c++ rejected the generated source:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: a library of plain functions just built from our source.
    unsafe { Library::new(&so) }.expect("load the host kernels")
}

fn dtype(e: Elem) -> DType {
    match e {
        Elem::F32 => DType::F32,
        Elem::F64 => DType::F64,
        Elem::F16 => DType::F16,
        Elem::Bf16 => DType::Bf16,
        Elem::I32 => DType::I32,
        Elem::I64 => DType::I64,
        Elem::U8 => DType::U8,
    }
}

fn redop(op: Op, avg: bool) -> RedOp {
    match op {
        Op::Sum if avg => RedOp::Avg,
        Op::Sum => RedOp::Sum,
        Op::Prod => RedOp::Prod,
        Op::Min => RedOp::Min,
        Op::Max => RedOp::Max,
    }
}

/// Random elements as bytes: mostly ordinary values (so sums and products
/// mean something), with raw bit patterns and the special values mixed in.
fn elements(e: Elem, n: usize, rng: &mut rand::rngs::StdRng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * e.size());
    for i in 0..n {
        let pick = rng.random_range(0..10);
        let v: f64 = match pick {
            0 => [
                0.0,
                -0.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
                1e-40,
                -1e-45,
                65504.0,
            ][i % 8],
            1..=6 => rng.random_range(-100.0..100.0),
            _ => f64::NAN, // replaced by raw bits below
        };
        match e {
            Elem::F32 => {
                let x = if pick >= 7 {
                    f32::from_bits(rng.random())
                } else {
                    v as f32
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Elem::F64 => {
                let x = if pick >= 7 {
                    f64::from_bits(rng.random())
                } else {
                    v
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Elem::F16 => {
                let x = if pick >= 7 {
                    rng.random()
                } else {
                    half::f16::from_f64(v).to_bits()
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Elem::Bf16 => {
                let x = if pick >= 7 {
                    rng.random()
                } else {
                    half::bf16::from_f64(v).to_bits()
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Elem::I32 => out.extend_from_slice(&rng.random::<i32>().to_le_bytes()),
            Elem::I64 => out.extend_from_slice(&rng.random::<i64>().to_le_bytes()),
            Elem::U8 => out.push(rng.random()),
        }
    }
    out
}

/// Calls `gw_host_reduce_<e>_<op>` or `gw_host_copy_<e>` with the compute
/// type's scalars.
pub struct Args {
    pub wa: Option<f64>,
    pub wb: Option<f64>,
    pub fin: bool,
    pub nranks: u32,
}

type ReduceFn<C> = unsafe extern "C" fn(*mut u8, *const u8, *const u8, u64, i32, C, i32, C, i32, C);
type CopyFn<C> = unsafe extern "C" fn(*mut u8, *const u8, u64, i32, C, i32, C);

/// The host path applies a weight only when it is not 1.
pub fn on(w: Option<f64>) -> Option<f64> {
    w.filter(|&w| w != 1.0)
}

#[allow(clippy::too_many_arguments)]
unsafe fn reduce_as<C: Copy>(
    lib: &Library,
    name: &str,
    conv: impl Fn(f64) -> C,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
    x: &Args,
) {
    let sym = format!("{}\0", name.replacen("gw_", "gw_host_", 1));
    // SAFETY: the generated signature for this compute type.
    let f = unsafe { lib.get::<ReduceFn<C>>(sym.as_bytes()) }.expect(name);
    let (wa, wb) = (on(x.wa), on(x.wb));
    // SAFETY: the buffers hold n elements; dst is a or distinct.
    unsafe {
        f(
            dst,
            a,
            b,
            n as u64,
            wa.is_some() as i32,
            conv(wa.unwrap_or(1.0)),
            wb.is_some() as i32,
            conv(wb.unwrap_or(1.0)),
            x.fin as i32,
            conv(f64::from(x.nranks)),
        )
    }
}

unsafe fn copy_as<C: Copy>(
    lib: &Library,
    name: &str,
    conv: impl Fn(f64) -> C,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    x: &Args,
) {
    let sym = format!("{}\0", name.replacen("gw_", "gw_host_", 1));
    // SAFETY: the generated signature for this compute type.
    let f = unsafe { lib.get::<CopyFn<C>>(sym.as_bytes()) }.expect(name);
    let ws = on(x.wa);
    // SAFETY: the buffers hold n elements; dst is src or distinct.
    unsafe {
        f(
            dst,
            src,
            n as u64,
            ws.is_some() as i32,
            conv(ws.unwrap_or(1.0)),
            x.fin as i32,
            conv(f64::from(x.nranks)),
        )
    }
}

macro_rules! by_compute {
    ($e:expr, $call:ident, $lib:expr, $name:expr, $($arg:expr),*) => {
        // SAFETY: forwarded to the callers below.
        unsafe {
            match $e {
                Elem::F64 => $call::<f64>($lib, $name, |v| v, $($arg),*),
                Elem::F32 | Elem::F16 | Elem::Bf16 => $call::<f32>($lib, $name, |v| v as f32, $($arg),*),
                Elem::I32 => $call::<u32>($lib, $name, |_| 0, $($arg),*),
                Elem::I64 => $call::<u64>($lib, $name, |_| 0, $($arg),*),
                Elem::U8 => $call::<u8>($lib, $name, |_| 0, $($arg),*),
            }
        }
    };
}

/// Whether an element's bytes are a NaN of its type.
fn is_nan(e: Elem, x: &[u8]) -> bool {
    match e {
        Elem::F32 => f32::from_le_bytes(x.try_into().expect("4 bytes")).is_nan(),
        Elem::F64 => f64::from_le_bytes(x.try_into().expect("8 bytes")).is_nan(),
        Elem::F16 => half::f16::from_le_bytes(x.try_into().expect("2 bytes")).is_nan(),
        Elem::Bf16 => half::bf16::from_le_bytes(x.try_into().expect("2 bytes")).is_nan(),
        _ => false,
    }
}

/// Bit for bit, except that a NaN result need only be a NaN: which NaN an
/// arithmetic operation on two NaNs returns depends on the order of the
/// instruction's operands (x86 returns the first), which a compiler may
/// swap for a commutative operation, and a GPU returns the canonical NaN
/// whatever the inputs. Selections (min, max) and conversions keep their
/// payloads and are compared exactly all the same, as are signed zeros.
fn same_bits(e: Elem, exact_nans: bool, what: &str, got: &[u8], want: &[u8], a: &[u8], b: &[u8]) {
    let s = e.size();
    for i in 0..got.len() / s {
        let r = i * s..(i + 1) * s;
        if !exact_nans && is_nan(e, &want[r.clone()]) && is_nan(e, &got[r.clone()]) {
            continue;
        }
        assert_eq!(
            got[r.clone()],
            want[r.clone()],
            "{what}: element {i}: device source gave {:02x?}, host path {:02x?} (inputs {:02x?}, {:02x?})",
            &got[r.clone()],
            &want[r.clone()],
            &a[r.clone()],
            b.get(r.clone()).unwrap_or(&[])
        );
    }
}

/// One way to run a generated kernel: on the host (the source compiled by
/// c++) or on a GPU. `reduce` writes `dst` (which is `a` when `in_place`).
pub trait Runner {
    fn reduce(&self, e: Elem, op: Op, a: &[u8], b: &[u8], x: &Args, in_place: bool) -> Vec<u8>;
    fn copy(&self, e: Elem, src: &[u8], x: &Args) -> Vec<u8>;
    /// The fan kernel over `ins` (in rank order), `nout` outputs; with
    /// `in_place` the outputs are the inputs. Returns every output.
    fn fan(&self, e: Elem, op: Op, ins: &[Vec<u8>], avg: bool, in_place: bool) -> Vec<Vec<u8>>;
}

type FanFn<C> = unsafe extern "C" fn(
    [*mut u8; kernels::MAX_FAN],
    i32,
    [*mut u8; kernels::MAX_FAN],
    i32,
    u64,
    i32,
    C,
);

/// Calls `gw_host_fan_<e>_<op>` on the buffers `outs` and `ins` point at
/// (the same ones for in place).
unsafe fn fan_as<C: Copy>(
    lib: &Library,
    name: &str,
    conv: impl Fn(f64) -> C,
    outs: &[*mut u8],
    ins: &[*mut u8],
    n: usize,
    avg: bool,
) {
    let sym = format!("{}\0", name.replacen("gw_", "gw_host_", 1));
    // SAFETY: the generated signature for this compute type.
    let f = unsafe { lib.get::<FanFn<C>>(sym.as_bytes()) }.expect(name);
    let mut o = [std::ptr::null_mut(); kernels::MAX_FAN];
    o[..outs.len()].copy_from_slice(outs);
    let mut i = [std::ptr::null_mut(); kernels::MAX_FAN];
    i[..ins.len()].copy_from_slice(ins);
    let nin = ins.len();
    // SAFETY: every pointer holds n elements.
    unsafe {
        f(
            o,
            outs.len() as i32,
            i,
            nin as i32,
            n as u64,
            avg as i32,
            conv(nin as f64),
        )
    }
}

struct HostRunner(Library);

impl Runner for HostRunner {
    fn fan(&self, e: Elem, op: Op, ins: &[Vec<u8>], avg: bool, in_place: bool) -> Vec<Vec<u8>> {
        let name = kernels::fan_name(e, op);
        let n = ins[0].len() / e.size();
        let mut ins = ins.to_vec();
        let ip: Vec<*mut u8> = ins.iter_mut().map(|v| v.as_mut_ptr()).collect();
        if in_place {
            // The outputs are the inputs: one set of buffers for both.
            by_compute!(e, fan_as, &self.0, &name, &ip, &ip, n, avg);
            return ins;
        }
        let mut outs = vec![vec![0u8; ins[0].len()]; 3];
        let op: Vec<*mut u8> = outs.iter_mut().map(|v| v.as_mut_ptr()).collect();
        by_compute!(e, fan_as, &self.0, &name, &op, &ip, n, avg);
        outs
    }

    fn reduce(&self, e: Elem, op: Op, a: &[u8], b: &[u8], x: &Args, in_place: bool) -> Vec<u8> {
        let name = kernels::reduce_name(e, op);
        let n = a.len() / e.size();
        let mut got = if in_place {
            a.to_vec()
        } else {
            vec![0u8; a.len()]
        };
        let p = got.as_mut_ptr();
        let src = if in_place { p as *const u8 } else { a.as_ptr() };
        by_compute!(e, reduce_as, &self.0, &name, p, src, b.as_ptr(), n, x);
        got
    }

    fn copy(&self, e: Elem, src: &[u8], x: &Args) -> Vec<u8> {
        let name = kernels::copy_name(e);
        let mut got = vec![0u8; src.len()];
        let n = src.len() / e.size();
        by_compute!(
            e,
            copy_as,
            &self.0,
            &name,
            got.as_mut_ptr(),
            src.as_ptr(),
            n,
            x
        );
        got
    }
}

#[test]
fn generated_kernels_match_the_host_path_bit_for_bit() {
    check_every_kernel(&HostRunner(host_library()));
}

/// Every dtype × operator × weights × division, in place and not, and
/// the copies, against gw-collectives' host kernels.
pub fn check_every_kernel(runner: &dyn Runner) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    let n = 4099;
    let mut checked = 0;
    for e in Elem::ALL {
        let weights: &[(Option<f64>, Option<f64>)] = if e.is_float() {
            &[
                (None, None),
                (Some(0.375), None),
                (None, Some(1.0 / 3.0)),
                (Some(2.5), Some(1e-3)),
            ]
        } else {
            &[(None, None)]
        };
        for op in Op::ALL {
            for avg in [false, true] {
                if avg && (op != Op::Sum || !e.is_float()) {
                    continue;
                }
                for &(wa, wb) in weights {
                    for fin in [false, true] {
                        let nranks = 3;
                        let k = Kernel::new(dtype(e), redop(op, avg), nranks).expect("kernel");
                        let a = elements(e, n, &mut rng);
                        let b = elements(e, n, &mut rng);
                        let mut want = vec![0u8; a.len()];
                        // SAFETY: three distinct buffers of n elements.
                        unsafe {
                            k.reduce(want.as_mut_ptr(), a.as_ptr(), wa, b.as_ptr(), wb, n, fin)
                        };
                        let x = Args {
                            wa,
                            wb,
                            fin: fin && avg,
                            nranks,
                        };
                        let name = kernels::reduce_name(e, op);
                        let got = runner.reduce(e, op, &a, &b, &x, false);
                        let what = format!("{name} wa={wa:?} wb={wb:?} fin={fin} avg={avg}");
                        // A selection with no arithmetic around it keeps payloads.
                        let exact = matches!(op, Op::Min | Op::Max)
                            && on(wa).is_none()
                            && on(wb).is_none()
                            && !x.fin;
                        same_bits(e, exact, &what, &got, &want, &a, &b);
                        // In place: dst is a.
                        let inplace = runner.reduce(e, op, &a, &b, &x, true);
                        same_bits(
                            e,
                            exact,
                            &format!("{what} in place"),
                            &inplace,
                            &want,
                            &a,
                            &b,
                        );
                        checked += 1;
                    }
                }
            }
        }
        // Copies: scaled and/or divided (avg's last step), as the host does.
        for (s, avg) in [
            (None, false),
            (Some(0.1), false),
            (None, true),
            (Some(3.0), true),
        ] {
            if (s.is_some() || avg) && !e.is_float() {
                continue;
            }
            let k = Kernel::new(dtype(e), if avg { RedOp::Avg } else { RedOp::Sum }, 4)
                .expect("kernel");
            let src = elements(e, n, &mut rng);
            let mut want = vec![0u8; src.len()];
            // SAFETY: two distinct buffers of n elements.
            unsafe { k.copy(want.as_mut_ptr(), src.as_ptr(), s, n, true) };
            let x = Args {
                wa: s,
                wb: None,
                fin: avg,
                nranks: 4,
            };
            let name = kernels::copy_name(e);
            let got = runner.copy(e, &src, &x);
            // A plain copy (and a 16-bit round trip) keeps payloads.
            let exact = s.is_none() && !avg;
            same_bits(
                e,
                exact,
                &format!("{name} s={s:?} avg={avg}"),
                &got,
                &want,
                &src,
                &[],
            );
        }
    }
    assert!(checked > 100, "{checked} combinations");
    check_fans(runner, &mut rng);
}

/// The fan kernel equals a chain of host steps in rank order, the last
/// one divided for avg, into every output, in place or not.
fn check_fans(runner: &dyn Runner, rng: &mut rand::rngs::StdRng) {
    let n = 1031;
    for e in Elem::ALL {
        for op in Op::ALL {
            for avg in [false, true] {
                if avg && (op != Op::Sum || !e.is_float()) {
                    continue;
                }
                for nin in [2usize, 3, 5, kernels::MAX_FAN] {
                    let ins: Vec<Vec<u8>> = (0..nin).map(|_| elements(e, n, rng)).collect();
                    let k = Kernel::new(dtype(e), redop(op, avg), nin as u32).expect("kernel");
                    let mut want = ins[0].clone();
                    for (j, x) in ins.iter().enumerate().skip(1) {
                        let acc = want.clone();
                        // SAFETY: distinct buffers of n elements.
                        unsafe {
                            k.reduce(
                                want.as_mut_ptr(),
                                acc.as_ptr(),
                                None,
                                x.as_ptr(),
                                None,
                                n,
                                j == nin - 1,
                            )
                        };
                    }
                    let exact = matches!(op, Op::Min | Op::Max);
                    for in_place in [false, true] {
                        let outs = runner.fan(e, op, &ins, avg, in_place);
                        for (o, got) in outs.iter().enumerate() {
                            let what = format!(
                                "{} nin={nin} avg={avg} in_place={in_place} output {o}",
                                kernels::fan_name(e, op)
                            );
                            same_bits(e, exact, &what, got, &want, &ins[0], &ins[1]);
                        }
                    }
                }
            }
        }
    }
}

/// The kernels on GPU 0, through gw-cuda's launches.
struct GpuRunner {
    gpu: &'static gw_cuda::Gpu,
    stream: gw_cuda::api::CUstream,
}

impl GpuRunner {
    fn upload(&self, bytes: &[u8]) -> gw_cuda::DeviceBuf {
        let buf = gw_cuda::DeviceBuf::new(self.gpu.driver(), bytes.len()).expect("cuMemAlloc");
        buf.upload(bytes).expect("upload");
        buf
    }

    fn finish(&self, buf: &gw_cuda::DeviceBuf, bytes: usize) -> Vec<u8> {
        // SAFETY: our own stream.
        unsafe { gw_cuda::memory::sync_stream(self.gpu.driver(), self.stream) }.expect("sync");
        let mut out = vec![0u8; bytes];
        buf.download(&mut out).expect("download");
        out
    }

    fn scaling(x: &Args) -> gw_cuda::Scaling {
        gw_cuda::Scaling {
            a: on(x.wa),
            b: on(x.wb),
            div: x.fin.then_some(f64::from(x.nranks)),
        }
    }
}

impl Runner for GpuRunner {
    fn fan(&self, e: Elem, op: Op, ins: &[Vec<u8>], avg: bool, in_place: bool) -> Vec<Vec<u8>> {
        let bytes = ins[0].len();
        let dins: Vec<gw_cuda::DeviceBuf> = ins.iter().map(|v| self.upload(v)).collect();
        let douts: Vec<gw_cuda::DeviceBuf> = if in_place {
            Vec::new()
        } else {
            (0..3)
                .map(|_| gw_cuda::DeviceBuf::new(self.gpu.driver(), bytes).expect("alloc"))
                .collect()
        };
        let outs = if in_place { &dins } else { &douts };
        let o: Vec<u64> = outs.iter().map(|b| b.ptr()).collect();
        let i: Vec<u64> = dins.iter().map(|b| b.ptr()).collect();
        let n = (bytes / e.size()) as u64;
        let div = avg.then_some(ins.len() as f64);
        self.gpu
            .fan(e, op, &o, &i, n, div, self.stream)
            .expect("launch");
        outs.iter().map(|b| self.finish(b, bytes)).collect()
    }

    fn reduce(&self, e: Elem, op: Op, a: &[u8], b: &[u8], x: &Args, in_place: bool) -> Vec<u8> {
        let (da, db) = (self.upload(a), self.upload(b));
        let out = gw_cuda::DeviceBuf::new(self.gpu.driver(), a.len()).expect("cuMemAlloc");
        let dst = if in_place { &da } else { &out };
        let n = (a.len() / e.size()) as u64;
        self.gpu
            .reduce(
                e,
                op,
                dst.ptr(),
                da.ptr(),
                db.ptr(),
                n,
                Self::scaling(x),
                self.stream,
            )
            .expect("launch");
        self.finish(dst, a.len())
    }

    fn copy(&self, e: Elem, src: &[u8], x: &Args) -> Vec<u8> {
        let ds = self.upload(src);
        let out = gw_cuda::DeviceBuf::new(self.gpu.driver(), src.len()).expect("cuMemAlloc");
        let n = (src.len() / e.size()) as u64;
        let s = Self::scaling(x);
        self.gpu
            .copy(e, out.ptr(), ds.ptr(), n, s.a, s.div, self.stream)
            .expect("launch");
        self.finish(&out, src.len())
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: set GW_TEST_CUDA=1"]
fn device_kernels_match_the_host_path_bit_for_bit() {
    let gpu = gw_cuda::Gpu::get(0).expect("GPU 0");
    gpu.make_current().expect("context");
    gpu.prepare().expect("compile and load the kernels");
    let stream = gpu.new_stream().expect("stream");
    check_every_kernel(&GpuRunner { gpu, stream });
}
