//! On a GPU (GW_TEST_CUDA=1): what a pointer is, and allocations checked
//! before a kernel could fault on them. Without a GPU these are ignored;
//! the no-driver path is `tests/driver.rs`.

use gw_cuda::memory::{self, MemKind};
use gw_cuda::{DeviceBuf, Gpu, PinnedBuf};

fn gpu() -> &'static Gpu {
    let g = Gpu::get(0).expect("GPU 0");
    g.make_current().expect("context");
    g
}

#[test]
#[ignore = "needs an NVIDIA GPU: set GW_TEST_CUDA=1"]
fn pointers_are_classified_by_where_they_live() {
    let g = gpu();
    let drv = g.driver();
    let d = DeviceBuf::new(drv, 4096).expect("alloc");
    let p = PinnedBuf::new(drv, 4096).expect("pinned");
    let h = vec![0u8; 4096];
    let kind = |ptr: *const u8| memory::classify(drv, ptr.cast()).expect("classify");
    assert_eq!(kind(d.ptr() as *const u8), MemKind::Device { ordinal: 0 });
    assert_eq!(
        kind((d.ptr() + 100) as *const u8),
        MemKind::Device { ordinal: 0 }
    );
    assert_eq!(kind(p.as_ptr()), MemKind::PinnedHost);
    assert_eq!(kind(h.as_ptr()), MemKind::Host);
    assert_eq!(kind(std::ptr::null()), MemKind::Host);
}

#[test]
#[ignore = "needs an NVIDIA GPU: set GW_TEST_CUDA=1"]
fn short_and_freed_allocations_are_named() {
    let g = gpu();
    let drv = g.driver();
    let d = DeviceBuf::new(drv, 1000).expect("alloc");
    memory::check_extent(drv, d.ptr(), 1000, "sendbuff").expect("fits");
    memory::check_extent(drv, d.ptr() + 500, 500, "sendbuff").expect("fits");
    let e = memory::check_extent(drv, d.ptr() + 500, 501, "recvbuff").unwrap_err();
    assert!(e.to_string().contains("recvbuff"), "{e}");
    assert!(e.to_string().contains("run past the end"), "{e}");
    let freed = d.ptr();
    drop(d);
    let e = memory::check_extent(drv, freed, 8, "sendbuff").unwrap_err();
    assert!(
        e.to_string().contains("not a live device allocation"),
        "{e}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: set GW_TEST_CUDA=1"]
fn a_large_reduction_covers_every_element() {
    // More elements than one grid pass (grid-stride loop) and a length
    // that is not a multiple of the block.
    let g = gpu();
    let drv = g.driver();
    let n = (g.sms as usize * 8 * 256) * 3 + 77;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (da, db) = (
        DeviceBuf::new(drv, n * 4).unwrap(),
        DeviceBuf::new(drv, n * 4).unwrap(),
    );
    da.upload(&bytes(&a)).unwrap();
    db.upload(&bytes(&b)).unwrap();
    let s = g.new_stream().unwrap();
    g.reduce(
        gw_cuda::Elem::F32,
        gw_cuda::Op::Sum,
        da.ptr(),
        da.ptr(),
        db.ptr(),
        n as u64,
        gw_cuda::Scaling::default(),
        s,
    )
    .unwrap();
    // SAFETY: our own stream.
    unsafe { memory::sync_stream(drv, s) }.unwrap();
    let mut out = vec![0u8; n * 4];
    da.download(&mut out).unwrap();
    for i in 0..n {
        let got = f32::from_le_bytes(out[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(got, a[i] + b[i], "element {i}");
    }
}
