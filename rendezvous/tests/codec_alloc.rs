//! How much the store's decoder allocates for what it has received, counted
//! by a global allocator that records the peak of live heap bytes. A count or
//! length in a frame is only the peer's claim; the decoder may hold the bytes
//! it got, not what they announce. One test in this binary, so that nothing
//! else allocates while it measures.

use gw_rendezvous::store::codec::{Decoder, Limits, MAX_HELLO_BODY, Request, Response};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only counts are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::SeqCst) + l.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
    }

    /// Forwarded to the system's `realloc` (which moves large blocks by
    /// remapping, not copying) and counted as the change in size; the default
    /// would count old and new block at once, which no real program holds.
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            if new_size >= l.size() {
                let now =
                    LIVE.fetch_add(new_size - l.size(), Ordering::SeqCst) + new_size - l.size();
                PEAK.fetch_max(now, Ordering::SeqCst);
            } else {
                LIVE.fetch_sub(l.size() - new_size, Ordering::SeqCst);
            }
        }
        q
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Heap bytes `f` held at its peak beyond what was live when it began.
fn peak_during(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst).saturating_sub(base)
}

/// A frame of `len` body bytes (tag included) starting with `head`, the
/// rest filled with `fill`.
fn frame(tag: u8, head: &[u8], body_len: usize, fill: u8) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + body_len);
    f.extend_from_slice(&(body_len as u32).to_le_bytes());
    f.push(tag);
    f.extend_from_slice(head);
    f.resize(4 + body_len, fill);
    f
}

const CHUNK: usize = 64 * 1024;
const MIB: usize = 1 << 20;

#[test]
fn decoders_hold_no_more_than_the_bytes_they_received() {
    let limits = Limits::default();

    // A Check frame of 16 MiB claiming 4 Mi keys whose first key is over
    // the cap. Received in 64 KiB reads, as the server reads. Before: the
    // buffer doubled to 32 MiB and the key list reserved 96 MiB at once.
    let check = frame(0x05, &(4u32 << 20).to_le_bytes(), 16 * MIB + 5, 0xff);
    let peak = peak_during(|| {
        let mut d = Decoder::<Request>::new(limits);
        let mut failed = None;
        for c in check.chunks(CHUNK) {
            d.push(c);
            if let Err(e) = d.next_frame() {
                failed = Some(e.to_string());
                break;
            }
        }
        let e = failed.expect("a forged Check frame must fail to decode");
        assert!(e.contains("key of"), "{e}");
    });
    assert!(
        peak <= check.len() + MIB,
        "decoding a {} byte Check frame held {peak} bytes at its peak",
        check.len()
    );

    // The client's side: an Exists reply claiming 16 Mi booleans whose
    // first one is invalid. Before: 16 MiB reserved on the count alone.
    let exists = frame(0x86, &(16u32 << 20).to_le_bytes(), 16 * MIB + 5, 2);
    let peak = peak_during(|| {
        let mut d = Decoder::<Response>::new(limits);
        d.push(&exists);
        let e = d.next_frame().expect_err("bad boolean");
        assert!(e.to_string().contains("boolean"), "{e}");
    });
    assert!(
        peak <= exists.len() + MIB,
        "decoding a {} byte Exists frame held {peak} bytes at its peak",
        exists.len()
    );

    // Before the Hello, 16 MiB offered is refused having buffered at most
    // one Hello, when reads follow the decoder's budget as the server's do.
    let stranger = frame(0x02, &[], 16 * MIB, 7);
    let peak = peak_during(|| {
        let mut d = Decoder::<Request>::hello_only(limits);
        let (mut at, mut reads) = (0, 0);
        let err = loop {
            let n = d.read_budget().unwrap_or(CHUNK).clamp(1, CHUNK);
            d.push(&stranger[at..(at + n).min(stranger.len())]);
            at += n;
            reads += 1;
            assert!(reads < 100, "still reading after {at} bytes");
            if let Err(e) = d.next_frame() {
                break e;
            }
        };
        assert!(err.to_string().contains("before authentication"), "{err}");
        assert!(at <= 4 + MAX_HELLO_BODY, "read {at} bytes");
    });
    assert!(
        peak <= 2 * (4 + MAX_HELLO_BODY),
        "a stranger's 16 MiB cost {peak} bytes"
    );
}
