//! Steady-state training steps allocate nothing (design principle 3,
//! "registered once, reused every step").
//!
//! Why this is its own test binary, without libtest's harness: the property is
//! about the *whole process* (caller threads, engine threads, transports), so
//! the binary installs a counting `#[global_allocator]` around `System` and
//! must be the only thing running. libtest would run other tests beside it and
//! print "has been running for over 60 seconds" from its own thread, both of
//! which allocate; `harness = false` (Cargo.toml) gives a plain `main`.
//!
//! How it proves the property: for each transport (shm, tcp, and ofi over
//! libfabric's tcp;ofi_rxm provider, whose own C allocations are not
//! counted: only gradwire's are), world size
//! (2, 3, 4) and forced all-reduce algorithm (ring, tree, and rhd where the
//! world size is a power of two), every rank runs in a thread of this process
//! with its own communicator (a store run by the test, as in `train/tests`).
//! All ranks run a fixed "training step" (all-reduce out of place, in place,
//! weighted and fused; reduce-scatter; all-gather; broadcast; reduce; barrier;
//! small messages and ones cut into many pipelined segments; a window of
//! `WINDOW` non-blocking messages around the ring, as pipeline code and MPI
//! benchmarks post them) for `WARMUP`
//! iterations, meet at a `std::sync::Barrier` (which does not allocate), and
//! rank 0 reads the global allocation counter. They then run `MEASURED` more
//! identical steps, meet again, and rank 0 reads the counter a second time.
//! Any allocation in between, on any thread, moves the counter and fails the
//! test with the count per configuration. With `GW_ALLOC_TRACE=1` the first
//! allocations inside the measured window print a backtrace, which names the
//! allocating code.
//!
//! Every step's results are checked too, so a "zero allocations" result cannot
//! come from operations that silently did nothing.

use gw_collectives::local::local_world;
use gw_collectives::{Algo, Communicator, RedOp, TransportChoice};
use gw_rendezvous::StoreServer;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};

#[path = "common/counting.rs"]
mod counting;

use counting::{ALLOCS, BYTES, Counting, TRACE, TRACED};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Iterations before the counter is read: the first builds schedules, grows
/// scratch, fusion and pooled buffers, and connects; a few more let every
/// pool reach its steady size.
const WARMUP: usize = 10;
const MEASURED: usize = 50;
/// Windows with stalls measured again at most this often.
const STALL_RETRIES: usize = 3;
/// Small enough that the medium size is cut into many pipelined segments and
/// fills the shm rings (exercising the early-frame buffers and announced
/// messages, which must not allocate either).
const SEGMENT_BYTES: usize = 16 << 10;
const SMALL: usize = 1000;
const MEDIUM: usize = 40_000;
const FUSED: [usize; 4] = [3, 100, 17, 900];
/// Non-blocking messages in flight at once: more than the completions a
/// communicator makes at creation (16), so that its pool must grow to hold
/// them instead of making one per call, and few enough that what a
/// transport queues for one peer (a frame each, and credits) stays within
/// the room it reserves per peer (64; a 40-message window grew the ofi
/// driver's queue once in four runs, after the warm-up).
const WINDOW: usize = 24;
/// Bytes of each of them.
const WINDOW_BYTES: usize = 256;

/// One rank's buffers, allocated before the warm-up and reused every step.
struct Bufs {
    send: Vec<f32>,
    recv: Vec<f32>,
    inplace: Vec<f32>,
    rs_send: Vec<f32>,
    rs_recv: Vec<f32>,
    ag_recv: Vec<f32>,
    fused: Vec<Vec<f32>>,
    /// What this rank sends in the window, and a slot per message it receives.
    p2p_send: Vec<u8>,
    p2p_recv: Vec<u8>,
    handles: Vec<gw_collectives::Handle>,
}

impl Bufs {
    fn new(n: usize, count: usize) -> Bufs {
        Bufs {
            send: vec![0.0; count],
            recv: vec![0.0; count],
            inplace: vec![0.0; count],
            rs_send: vec![0.0; count * n],
            rs_recv: vec![0.0; count],
            ag_recv: vec![0.0; count * n],
            fused: FUSED.iter().map(|&l| vec![0.0; l]).collect(),
            p2p_send: vec![0; WINDOW_BYTES],
            p2p_recv: vec![0; WINDOW * WINDOW_BYTES],
            handles: Vec::with_capacity(WINDOW),
        }
    }
}

/// One training step on one rank; checks every result (small integers are
/// exact in f32). Errors are strings so that nothing allocates on success.
fn step(c: &Communicator, b: &mut Bufs, it: usize) -> Result<(), String> {
    let (r, n) = (c.rank() as usize, c.size() as usize);
    let v = (r + it % 7) as f32;
    let sum: f32 = (0..n).map(|q| (q + it % 7) as f32).sum();
    let bad = |what: &str, got: f32, want: f32| {
        Err(format!(
            "rank {r} iteration {it}: {what} gave {got}, want {want}"
        ))
    };
    b.send.fill(v);
    c.all_reduce(&b.send, &mut b.recv, RedOp::Sum)
        .map_err(|e| e.to_string())?;
    if b.recv[b.recv.len() - 1] != sum || b.recv[0] != sum {
        return bad("all_reduce", b.recv[0], sum);
    }
    b.inplace.fill(v);
    c.all_reduce_in_place(&mut b.inplace, RedOp::Max)
        .map_err(|e| e.to_string())?;
    let max = (n - 1 + it % 7) as f32;
    if b.inplace[0] != max {
        return bad("all_reduce_in_place max", b.inplace[0], max);
    }
    c.all_reduce_weighted(&b.send, &mut b.recv, 2.0)
        .map_err(|e| e.to_string())?;
    if b.recv[0] != 2.0 * sum {
        return bad("all_reduce_weighted", b.recv[0], 2.0 * sum);
    }
    for t in &mut b.fused {
        t.fill(v);
    }
    {
        let mut views: [&mut [f32]; FUSED.len()] = Default::default();
        for (view, t) in views.iter_mut().zip(b.fused.iter_mut()) {
            *view = t.as_mut_slice();
        }
        c.all_reduce_fused(&mut views, RedOp::Sum, None)
            .map_err(|e| e.to_string())?;
    }
    if b.fused[3][899] != sum {
        return bad("all_reduce_fused", b.fused[3][899], sum);
    }
    b.rs_send.fill(v);
    c.reduce_scatter(&b.rs_send, &mut b.rs_recv, RedOp::Sum)
        .map_err(|e| e.to_string())?;
    if b.rs_recv[0] != sum {
        return bad("reduce_scatter", b.rs_recv[0], sum);
    }
    b.send.fill(v);
    c.all_gather(&b.send, &mut b.ag_recv)
        .map_err(|e| e.to_string())?;
    let last = (n - 1 + it % 7) as f32;
    if b.ag_recv[b.ag_recv.len() - 1] != last {
        return bad("all_gather", b.ag_recv[b.ag_recv.len() - 1], last);
    }
    let root = it % n;
    b.inplace.fill(v);
    c.broadcast(&mut b.inplace, root as u32)
        .map_err(|e| e.to_string())?;
    let want = (root + it % 7) as f32;
    if b.inplace[0] != want {
        return bad("broadcast", b.inplace[0], want);
    }
    c.reduce(&b.send, &mut b.recv, RedOp::Sum, root as u32)
        .map_err(|e| e.to_string())?;
    if r == root && b.recv[0] != sum {
        return bad("reduce", b.recv[0], sum);
    }
    window(c, b, it)?;
    c.barrier().map_err(|e| e.to_string())?;
    Ok(())
}

/// `WINDOW` messages to the next rank and from the previous one, all posted
/// before any is waited for; checks every received byte.
fn window(c: &Communicator, b: &mut Bufs, it: usize) -> Result<(), String> {
    let (r, n) = (c.rank() as usize, c.size() as usize);
    let (to, from) = (((r + 1) % n) as u32, ((r + n - 1) % n) as u32);
    let byte = |rank: usize| (rank * 31 + it) as u8;
    b.p2p_send.fill(byte(r));
    b.p2p_recv.fill(0);
    let send = (to, b.p2p_send.as_ptr(), WINDOW_BYTES);
    for slot in b.p2p_recv.chunks_exact_mut(WINDOW_BYTES) {
        // SAFETY: both buffers outlive the handles, which are all waited
        // for below before they are touched again.
        let h = unsafe {
            c.sendrecv_raw(
                gw_collectives::DType::U8,
                Some(send),
                Some((from, slot.as_mut_ptr(), WINDOW_BYTES)),
            )
        }
        .map_err(|e| e.to_string())?;
        b.handles.push(h);
    }
    let mut first = Ok(());
    for h in b.handles.drain(..) {
        if let Err(e) = h.wait() {
            first = first.and(Err(e.to_string()));
        }
    }
    first?;
    if let Some(i) = b.p2p_recv.iter().position(|&x| x != byte((r + n - 1) % n)) {
        return Err(format!(
            "rank {r} iteration {it}: window byte {i} is {}, want {}",
            b.p2p_recv[i],
            byte((r + n - 1) % n)
        ));
    }
    Ok(())
}

fn comms(
    transport: TransportChoice,
    world: u32,
    algo: Algo,
    key: &str,
) -> (StoreServer, Vec<Communicator>) {
    local_world(world, key, |_, cfg| {
        cfg.transport.set(transport);
        // libfabric's provider that needs no hardware (the default would
        // pick verbs or EFA where they exist).
        cfg.ofi_provider.set(Some("tcp;ofi_rxm".into()));
        cfg.algo.set(Some(algo));
        cfg.segment_bytes.set(SEGMENT_BYTES);
        cfg.shm_slot_bytes.set(SEGMENT_BYTES);
        cfg.shm_slots.set(4);
        // Room for the fused tensors but not for MEDIUM, which then
        // goes through fusion's "too big, reduce on its own" path.
        cfg.fusion_bytes.set(8 << 10);
    })
    .expect("communicators")
}

/// What one measured window saw.
struct Window {
    allocs: u64,
    bytes: u64,
    /// Engine stall checks in the window (see `stall_checks`).
    stalls: u64,
}

/// Runs the warm-up and the measured window on `comms`; returns what the
/// measured window counted, or an error.
fn measure(comms: &[Communicator], count: usize) -> Result<Window, String> {
    let n = comms.len();
    let gate = Barrier::new(n);
    let before = AtomicU64::new(0);
    let before_bytes = AtomicU64::new(0);
    let before_stalls = AtomicU64::new(0);
    let trace = counting::trace_from_env();
    // Reserved here: see `join_ranks`.
    let mut results: Vec<Result<Window, String>> = Vec::with_capacity(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let (gate, before, before_bytes, before_stalls) =
                    (&gate, &before, &before_bytes, &before_stalls);
                s.spawn(move || {
                    let mut b = Bufs::new(n, count);
                    let mut res = Ok(());
                    for it in 0..WARMUP {
                        res = res.and_then(|_| step(c, &mut b, it));
                    }
                    gate.wait();
                    if c.rank() == 0 {
                        before.store(ALLOCS.load(Ordering::SeqCst), Ordering::SeqCst);
                        before_bytes.store(BYTES.load(Ordering::SeqCst), Ordering::SeqCst);
                        before_stalls.store(gw_collectives::stall_checks(), Ordering::SeqCst);
                        TRACED.store(0, Ordering::SeqCst);
                        TRACE.store(trace, Ordering::SeqCst);
                    }
                    gate.wait();
                    for it in WARMUP..WARMUP + MEASURED {
                        if res.is_ok() {
                            res = step(c, &mut b, it);
                        }
                    }
                    gate.wait();
                    let counted = Window {
                        allocs: ALLOCS.load(Ordering::SeqCst) - before.load(Ordering::SeqCst),
                        bytes: BYTES.load(Ordering::SeqCst) - before_bytes.load(Ordering::SeqCst),
                        stalls: gw_collectives::stall_checks()
                            - before_stalls.load(Ordering::SeqCst),
                    };
                    TRACE.store(false, Ordering::SeqCst);
                    res.map(|_| counted)
                })
            })
            .collect();
        counting::join_ranks(hs, &mut results)
    });
    // Every rank read the counters after the same barrier; the largest
    // reading counts (a later allocation could only make it larger).
    let mut out = Window {
        allocs: 0,
        bytes: 0,
        stalls: 0,
    };
    for r in results {
        let w = r?;
        out.allocs = out.allocs.max(w.allocs);
        out.bytes = out.bytes.max(w.bytes);
        out.stalls = out.stalls.max(w.stalls);
    }
    Ok(out)
}

fn main() {
    // `GW_ALLOC_ONLY=shm-4-ring` runs one configuration (transport, world
    // size, algorithm), for tracing.
    let only = std::env::var("GW_ALLOC_ONLY").ok();
    let mut failures = Vec::new();
    let mut key = 0;
    for transport in [
        TransportChoice::Shm,
        TransportChoice::Tcp,
        TransportChoice::Ofi,
    ] {
        for world in [2u32, 3, 4] {
            for algo in [Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Rd] {
                if algo == Algo::Rhd && !world.is_power_of_two() {
                    continue;
                }
                key += 1;
                let name = format!("{}-{world}-{}", transport.name(), algo.name());
                if only.as_ref().is_some_and(|o| *o != name) {
                    continue;
                }
                let (_store, comms) = comms(transport, world, algo, &format!("k{key}"));
                for count in [SMALL, MEDIUM] {
                    let what = format!(
                        "{} world {world} all-reduce {} count {count}",
                        transport.name(),
                        algo.name()
                    );
                    // An operation that waited 200 ms without progress (an
                    // overloaded machine, not a steady state) has its engine
                    // consult the store, which allocates: such a window is
                    // measured again, a few times at most.
                    let mut res = measure(&comms, count);
                    for _ in 0..STALL_RETRIES {
                        match &res {
                            Ok(w) if w.allocs > 0 && w.stalls > 0 => {
                                println!(
                                    "{what}: {} allocations with {} stall checks (overloaded?); measuring again",
                                    w.allocs, w.stalls
                                );
                                res = measure(&comms, count);
                            }
                            _ => break,
                        }
                    }
                    match res {
                        Ok(w) if w.allocs == 0 => {
                            println!("{what}: 0 allocations in {MEASURED} steps")
                        }
                        Ok(w) => {
                            println!(
                                "{what}: {} allocations ({} bytes, {} stall checks) in {MEASURED} steps",
                                w.allocs, w.bytes, w.stalls
                            );
                            failures.push(format!(
                                "{what}: {} allocations ({} bytes)",
                                w.allocs, w.bytes
                            ));
                        }
                        Err(e) => {
                            println!("{what}: failed: {e}");
                            failures.push(format!("{what}: {e}"));
                        }
                    }
                }
                drop(comms);
            }
        }
    }
    if !failures.is_empty() {
        eprintln!(
            "steady-state steps allocated (rerun with GW_ALLOC_TRACE=1 for backtraces):\n  {}",
            failures.join("\n  ")
        );
        std::process::exit(1);
    }
    println!("no_alloc: every steady-state step allocated nothing");
}
