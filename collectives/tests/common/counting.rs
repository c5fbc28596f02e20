//! The counting global allocator of the allocation tests (`no_alloc.rs`,
//! `persistent_no_alloc.rs`): every allocation of the process is counted,
//! and inside a measured window with `GW_ALLOC_TRACE` set the first few
//! print a backtrace. Each test includes this file with `#[path]` and
//! installs `Counting` as its `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Counts every allocation and reallocation of the process.
pub struct Counting;

pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
pub static BYTES: AtomicU64 = AtomicU64::new(0);
/// Set while a measured window is open and `GW_ALLOC_TRACE` is set.
pub static TRACE: AtomicBool = AtomicBool::new(false);
/// Backtraces printed so far in this window, and how many to print
/// (`GW_ALLOC_TRACE=N`, default 6: a few name the culprits).
pub static TRACED: AtomicUsize = AtomicUsize::new(0);
static MAX_TRACES: AtomicUsize = AtomicUsize::new(6);

thread_local! {
    /// Keeps the backtrace's own allocations from recursing into tracing.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    // The backtrace printer's own allocations are not the code's: counting
    // them turned one stray allocation into thousands.
    if IN_TRACE.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size as u64, Ordering::Relaxed);
    if TRACE.load(Ordering::Relaxed) && IN_TRACE.try_with(|t| !t.replace(true)).unwrap_or(false) {
        if TRACED.fetch_add(1, Ordering::Relaxed) < MAX_TRACES.load(Ordering::Relaxed) {
            let bt = std::backtrace::Backtrace::force_capture();
            let name = std::thread::current().name().map(str::to_owned);
            eprintln!(
                "allocation of {size} bytes on thread {name:?} in the measured window:\n{bt}"
            );
        }
        IN_TRACE.with(|t| t.set(false));
    }
}

// SAFETY: forwards to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Whether `GW_ALLOC_TRACE` asks for backtraces (`GW_ALLOC_TRACE=N` prints
/// at most N a window).
pub fn trace_from_env() -> bool {
    match std::env::var("GW_ALLOC_TRACE") {
        Ok(v) => {
            if let Ok(n) = v.parse() {
                MAX_TRACES.store(n, Ordering::Relaxed);
            }
            true
        }
        Err(_) => false,
    }
}

/// Joins the measuring rank threads of a scope into `out`, a panic as an
/// error. `out` must have room for every rank, reserved before the threads
/// were spawned: this runs on the main thread, which may get here while the
/// ranks are still inside the measured window (descheduled through a whole
/// warm-up, it once allocated the result vector there and failed the test),
/// so it must not allocate.
pub fn join_ranks<T>(
    hs: Vec<std::thread::ScopedJoinHandle<'_, Result<T, String>>>,
    out: &mut Vec<Result<T, String>>,
) {
    assert!(
        out.capacity() - out.len() >= hs.len(),
        "join_ranks: reserve room for every rank before spawning them"
    );
    for h in hs {
        out.push(
            h.join()
                .unwrap_or_else(|_| Err("rank thread panicked".into())),
        );
    }
}
