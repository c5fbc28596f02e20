//! Every generated kernel compiles to PTX with NVRTC (no GPU or driver
//! needed), with the rounding the host path has: no fused multiply-add,
//! no flush of subnormals to zero, IEEE division.
//!
//! NVRTC comes from PyPI (`nvidia-cuda-nvrtc`, installed by
//! `scripts/test.sh`, which sets `GW_NVRTC_LIB` and
//! `GW_TEST_NVRTC=required`). Run by hand without it, the test says loudly
//! that it skipped.

use gw_cuda::kernels::{self, Elem};
use gw_cuda::{Error, Nvrtc};

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) if std::env::var("GW_TEST_NVRTC").as_deref() == Ok("required") => {
            panic!("GW_TEST_NVRTC=required but {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: NVRTC is not installed here ({e}); scripts/test.sh installs it");
            None
        }
    }
}

#[test]
fn every_kernel_compiles_to_ptx_with_host_rounding() {
    let Some(nv) = nvrtc() else { return };
    let (major, _) = nv.version().expect("nvrtcVersion");
    assert!(major >= 12, "NVRTC {major} at {}", nv.path);
    let ptx = nv
        .ptx(&kernels::source(), "gw_kernels.cu", "compute_90")
        .expect("the generated source compiles");
    for name in kernels::entry_names() {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "{name} is not in the PTX"
        );
    }
    // Rounding as on the host: each multiply and add rounded on its own,
    // subnormals kept, divisions correctly rounded.
    assert!(!ptx.contains("fma."), "a fused multiply-add in the PTX");
    assert!(!ptx.contains(".ftz"), "flush-to-zero in the PTX");
    // No kernel spills: the fan kernels' pointer arrays stay in the
    // parameter space only if every index is known at compile time.
    assert!(!ptx.contains(".local"), "a kernel uses local memory");
    assert!(ptx.contains("div.rn.f32"), "avg's f32 division is not IEEE");
    assert!(ptx.contains("div.rn.f64"), "avg's f64 division is not IEEE");
    assert!(ptx.contains("mul.rn.f32") || ptx.contains("mul.f32"));
    // Every dtype's sum is there, in its own arithmetic.
    for e in Elem::ALL {
        assert!(ptx.contains(&kernels::reduce_name(e, gw_cuda::Op::Sum)));
    }
}

#[test]
fn compile_errors_and_bad_architectures_are_reported() {
    let Some(nv) = nvrtc() else { return };
    match nv.ptx("this is not C++", "broken.cu", "compute_90") {
        Err(Error::Nvrtc { call, log, .. }) => {
            assert_eq!(call, "nvrtcCompileProgram");
            assert!(log.contains("broken.cu"), "the log names the file: {log}");
        }
        other => panic!("a broken source gave {other:?}"),
    }
    match nv.ptx("", "x.cu", "sm_90; rm -rf") {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("compute_90"), "{m}"),
        other => panic!("a bad architecture gave {other:?}"),
    }
}

#[test]
fn a_missing_nvrtc_names_what_was_tried() {
    let tried = ["/nonexistent/libnvrtc.so.99".to_string()];
    match Nvrtc::load_from(&tried) {
        Err(e @ Error::NvrtcNotFound { .. }) => {
            let m = e.to_string();
            assert!(m.contains("/nonexistent/libnvrtc.so.99"), "{m}");
            assert!(m.contains("No such file"), "the loader's reason: {m}");
            assert!(m.contains("nvidia-cuda-nvrtc"), "how to get it: {m}");
        }
        other => panic!("gave {other:?}"),
    }
}
