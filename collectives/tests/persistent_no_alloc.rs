//! Steady-state rounds of a persistent all-reduce allocate nothing: what
//! `persistent.rs` promises (each `start` draws a sequence number, takes a
//! pooled completion and queues one message; the engine rewinds the kept
//! schedule and uses the kept registrations).
//!
//! Built like `no_alloc.rs` (see there for why it is a binary of its own,
//! without libtest's harness): a counting `#[global_allocator]`, every rank
//! a thread of this process with its own communicator over real shm or TCP.
//! Each rank makes two persistent requests (in place and out of place)
//! before anything is counted, runs `WARMUP` rounds of each, meets the
//! others at a `std::sync::Barrier`, and rank 0 reads the counter; then
//! `MEASURED` rounds of `start` + `wait` with new inputs every round, and
//! the counter again. Every round's result is checked, and any allocation
//! in the window, on any thread, fails the test, as does any registration
//! of memory with a transport (`gw_collectives::registrations`). `GW_ALLOC_TRACE=1` prints
//! backtraces of the first ones.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, OneSided, RedOp, TransportChoice};
use gw_rendezvous::StoreServer;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};

#[path = "common/counting.rs"]
mod counting;

use counting::{ALLOCS, BYTES, Counting, TRACE, TRACED};

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARMUP: usize = 10;
const MEASURED: usize = 50;
/// Windows with stalls measured again at most this often.
const STALL_RETRIES: usize = 3;
/// Small segments, so the larger count is many pipelined messages.
const SEGMENT_BYTES: usize = 16 << 10;

/// One rank's rounds `its` of both requests, each result checked. Errors
/// are strings, so that nothing allocates on success.
fn rounds(
    c: &Communicator,
    a: &mut gw_collectives::PersistentAllReduce<'_, f32>,
    b: &mut gw_collectives::PersistentAllReduce<'_, f32>,
    its: std::ops::Range<usize>,
) -> Result<(), String> {
    let (r, n) = (c.rank() as usize, c.size() as usize);
    for it in its {
        let v = (r + it % 7) as f32;
        let sum: f32 = (0..n).map(|q| (q + it % 7) as f32).sum();
        a.send_mut().map_err(|e| e.to_string())?.fill(v);
        a.start().map_err(|e| e.to_string())?;
        a.wait().map_err(|e| e.to_string())?;
        b.send_mut().map_err(|e| e.to_string())?.fill(v);
        b.start().map_err(|e| e.to_string())?;
        b.wait().map_err(|e| e.to_string())?;
        for (what, got) in [("out of place", a.recv()), ("in place", b.recv())] {
            let got = got.map_err(|e| e.to_string())?;
            if got[0] != sum || got[got.len() - 1] != sum {
                return Err(format!(
                    "rank {r} round {it} {what}: got {}, want {sum}",
                    got[0]
                ));
            }
        }
    }
    Ok(())
}

/// What one measured window saw.
struct Window {
    allocs: u64,
    bytes: u64,
    stalls: u64,
    /// Buffers registered with a transport in the window.
    registrations: u64,
}

fn measure(comms: &[Communicator], count: usize, host: bool) -> Result<Window, String> {
    let n = comms.len();
    let gate = Barrier::new(n);
    let before = AtomicU64::new(0);
    let before_bytes = AtomicU64::new(0);
    let before_stalls = AtomicU64::new(0);
    let before_regs = AtomicU64::new(0);
    let trace = counting::trace_from_env();
    let mut results: Vec<Result<Window, String>> = Vec::with_capacity(comms.len());
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let (gate, before, before_bytes, before_stalls, before_regs) =
                    (&gate, &before, &before_bytes, &before_stalls, &before_regs);
                s.spawn(move || {
                    let mut send = vec![0f32; count];
                    let mut recv = vec![0f32; count];
                    let mut inplace = vec![0f32; count];
                    let mut a = c
                        .all_reduce_init(&mut send, &mut recv, RedOp::Sum)
                        .map_err(|e| e.to_string())?;
                    let mut b = c
                        .all_reduce_init_in_place(&mut inplace, RedOp::Sum)
                        .map_err(|e| e.to_string())?;
                    if a.on_host() != host || b.on_host() != host {
                        return Err(format!("host rounds {}, want {host}", a.on_host()));
                    }
                    let mut res = rounds(c, &mut a, &mut b, 0..WARMUP);
                    gate.wait();
                    if c.rank() == 0 {
                        // Tracing first: an allocation just after the
                        // first reading is counted, so it must be traced.
                        TRACED.store(0, Ordering::SeqCst);
                        TRACE.store(trace, Ordering::SeqCst);
                        before.store(ALLOCS.load(Ordering::SeqCst), Ordering::SeqCst);
                        before_bytes.store(BYTES.load(Ordering::SeqCst), Ordering::SeqCst);
                        before_stalls.store(gw_collectives::stall_checks(), Ordering::SeqCst);
                        before_regs.store(gw_collectives::registrations(), Ordering::SeqCst);
                    }
                    gate.wait();
                    if res.is_ok() {
                        res = rounds(c, &mut a, &mut b, WARMUP..WARMUP + MEASURED);
                    }
                    gate.wait();
                    let counted = Window {
                        allocs: ALLOCS.load(Ordering::SeqCst) - before.load(Ordering::SeqCst),
                        bytes: BYTES.load(Ordering::SeqCst) - before_bytes.load(Ordering::SeqCst),
                        stalls: gw_collectives::stall_checks()
                            - before_stalls.load(Ordering::SeqCst),
                        registrations: gw_collectives::registrations()
                            - before_regs.load(Ordering::SeqCst),
                    };
                    // Nobody frees its requests (which is not a steady-state
                    // round) before every rank has read the counters.
                    gate.wait();
                    TRACE.store(false, Ordering::SeqCst);
                    res.map(|_| counted)
                })
            })
            .collect();
        counting::join_ranks(hs, &mut results)
    });
    let mut out = Window {
        allocs: 0,
        bytes: 0,
        stalls: 0,
        registrations: 0,
    };
    for r in results {
        let w = r?;
        out.allocs = out.allocs.max(w.allocs);
        out.bytes = out.bytes.max(w.bytes);
        out.stalls = out.stalls.max(w.stalls);
        out.registrations = out.registrations.max(w.registrations);
    }
    Ok(out)
}

fn main() {
    let mut failures = Vec::new();
    let mut key = 0;
    // Host rounds (the default on shm), two-sided rounds (shm with
    // GW_HOST_ROUND_BYTES=0, and TCP) and one-sided ones (GW_ONE_SIDED=1
    // over shm, libfabric and TCP).
    for (transport, mode, host) in [
        (TransportChoice::Shm, OneSided::Auto, true),
        (TransportChoice::Shm, OneSided::Auto, false),
        (TransportChoice::Shm, OneSided::Always, false),
        (TransportChoice::Ofi, OneSided::Always, false),
        (TransportChoice::Tcp, OneSided::Auto, false),
        (TransportChoice::Tcp, OneSided::Always, false),
    ] {
        for world in [2u32, 3, 4] {
            key += 1;
            let (_store, comms): (StoreServer, Vec<Communicator>) =
                local_world(world, &format!("pna{key}"), |_, cfg| {
                    cfg.transport.set(transport);
                    cfg.ofi_provider.set(Some("tcp;ofi_rxm".into()));
                    cfg.one_sided.set(mode);
                    // 4 ranks on 2 cores would keep host rounds to 2 KiB.
                    cfg.host_round_bytes.set(if host { 1 << 20 } else { 0 });
                    cfg.segment_bytes.set(SEGMENT_BYTES);
                    cfg.shm_slot_bytes.set(SEGMENT_BYTES);
                    cfg.shm_slots.set(4);
                })
                .expect("communicators");
            for count in [1000usize, 40_000] {
                let what = format!(
                    "{} ({}) world {world} persistent all-reduce count {count}",
                    transport.name(),
                    if mode == OneSided::Always {
                        "one-sided"
                    } else if host {
                        "host rounds"
                    } else {
                        "two-sided"
                    }
                );
                let mut res = measure(&comms, count, host);
                for _ in 0..STALL_RETRIES {
                    match &res {
                        Ok(w) if w.allocs > 0 && w.stalls > 0 => {
                            println!(
                                "{what}: {} allocations with {} stall checks (overloaded?); measuring again",
                                w.allocs, w.stalls
                            );
                            res = measure(&comms, count, host);
                        }
                        _ => break,
                    }
                }
                match res {
                    Ok(w) if w.registrations > 0 => {
                        println!(
                            "{what}: {} registrations in {MEASURED} rounds",
                            w.registrations
                        );
                        failures.push(format!("{what}: {} registrations", w.registrations));
                    }
                    Ok(w) if w.allocs == 0 => {
                        println!(
                            "{what}: 0 allocations and 0 registrations in {MEASURED} rounds of start + wait"
                        )
                    }
                    Ok(w) => {
                        println!(
                            "{what}: {} allocations ({} bytes, {} stall checks) in {MEASURED} rounds",
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
    if !failures.is_empty() {
        eprintln!(
            "persistent rounds allocated (rerun with GW_ALLOC_TRACE=1 for backtraces):\n  {}",
            failures.join("\n  ")
        );
        std::process::exit(1);
    }
    println!("persistent_no_alloc: every steady-state round allocated nothing");
}
