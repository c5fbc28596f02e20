//! Steady-state rounds of a persistent put or get (`put_init`, `get_init`)
//! allocate nothing and register nothing, as persistent all-reduce rounds
//! do not (`persistent_no_alloc.rs`, whose way of measuring this follows):
//! a counting `#[global_allocator]`, no libtest harness, both ranks threads
//! of this process with their own communicator over real shared memory,
//! TCP or libfabric's tcp provider. Each rank plans a transfer both ways, runs
//! `WARMUP` rounds, meets the other at a barrier while rank 0 reads the
//! counters, runs `MEASURED` rounds with new contents every round (every
//! round's bytes checked), and the counters are read again. A window with
//! stall checks (an overloaded machine) is measured again, at most
//! `STALL_RETRIES` times.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, PersistentTransfer, TransportChoice};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};

#[path = "common/counting.rs"]
mod counting;

use counting::{ALLOCS, BYTES, Counting, TRACE, TRACED};

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARMUP: usize = 10;
const MEASURED: usize = 50;
const STALL_RETRIES: usize = 3;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Put,
    Get,
}

fn byte(rank: usize, round: usize, i: usize) -> u8 {
    (rank * 31 + round * 7 + i) as u8
}

/// Rounds `its` of `t`: this rank's bytes changed between rounds through
/// `src` (no round runs then), the peer's checked where they land.
fn rounds(
    t: &mut PersistentTransfer<'_>,
    me: usize,
    src: *mut u8,
    dst: *const u8,
    len: usize,
    its: std::ops::Range<usize>,
) -> Result<(), String> {
    for k in its {
        // SAFETY: no round is running; the plan reads `src` and writes
        // `dst` only during one.
        unsafe {
            for i in [0, len / 2, len - 1] {
                *src.add(i) = byte(me, k, i);
            }
        }
        t.start().map_err(|e| e.to_string())?;
        t.wait().map_err(|e| e.to_string())?;
        for i in [0, len / 2, len - 1] {
            // SAFETY: as above.
            let got = unsafe { *dst.add(i) };
            if got != byte(1 - me, k, i) {
                return Err(format!("rank {me} round {k} byte {i}: {got}"));
            }
        }
    }
    Ok(())
}

/// (allocations, bytes, stall checks, registrations) in the window of the
/// slower-to-agree rank, or the first error.
fn measure(comms: &[Communicator], kind: Kind, len: usize) -> Result<[u64; 4], String> {
    let gate = Barrier::new(comms.len());
    let before = [(); 4].map(|_| AtomicU64::new(0));
    let trace = counting::trace_from_env();
    let read = || {
        [
            ALLOCS.load(Ordering::SeqCst),
            BYTES.load(Ordering::SeqCst),
            gw_collectives::stall_checks(),
            gw_collectives::registrations(),
        ]
    };
    let mut results: Vec<Result<[u64; 4], String>> = Vec::with_capacity(comms.len());
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let (gate, before, read) = (&gate, &before, &read);
                s.spawn(move || {
                    let me = c.rank() as usize;
                    let mut src = vec![0u8; len];
                    let mut dst = vec![0u8; len];
                    let (sp, dp) = (src.as_mut_ptr(), dst.as_ptr());
                    let planned = match kind {
                        Kind::Put => c.put_init(&src, &mut dst, 2),
                        Kind::Get => c.get_init(&src, &mut dst, 2),
                    };
                    let mut t = planned.map_err(|e| e.to_string())?;
                    let mut res = rounds(&mut t, me, sp, dp, len, 0..WARMUP);
                    gate.wait();
                    if me == 0 {
                        TRACED.store(0, Ordering::SeqCst);
                        TRACE.store(trace, Ordering::SeqCst);
                        for (b, v) in before.iter().zip(read()) {
                            b.store(v, Ordering::SeqCst);
                        }
                    }
                    gate.wait();
                    if res.is_ok() {
                        res = rounds(&mut t, me, sp, dp, len, WARMUP..WARMUP + MEASURED);
                    }
                    gate.wait();
                    let now = read();
                    let counted = [0, 1, 2, 3].map(|i| now[i] - before[i].load(Ordering::SeqCst));
                    // Nobody frees its plan before both read the counters.
                    gate.wait();
                    TRACE.store(false, Ordering::SeqCst);
                    res.map(|_| counted)
                })
            })
            .collect();
        counting::join_ranks(hs, &mut results)
    });
    let mut out = [0u64; 4];
    for r in results {
        let w = r?;
        for i in 0..4 {
            out[i] = out[i].max(w[i]);
        }
    }
    Ok(out)
}

fn main() {
    let mut failures = Vec::new();
    for (key, (transport, provider)) in [
        (TransportChoice::Shm, None),
        (TransportChoice::Tcp, None),
        (TransportChoice::Ofi, Some("tcp;ofi_rxm")),
    ]
    .into_iter()
    .enumerate()
    {
        let (_store, comms) = local_world(2, &format!("tna{key}"), |_, cfg| {
            cfg.transport.set(transport);
            cfg.ofi_provider.set(provider.map(str::to_owned));
        })
        .expect("communicators");
        for kind in [Kind::Put, Kind::Get] {
            // One segment, and several (puts and gets move 1 MiB at most at once).
            for len in [65_536usize, (3 << 20) + 5] {
                let what = format!("{} {kind:?} of {len} bytes both ways", transport.name());
                let mut res = measure(&comms, kind, len);
                for _ in 0..STALL_RETRIES {
                    match &res {
                        Ok(w) if w[0] > 0 && w[2] > 0 => {
                            println!(
                                "{what}: {} allocations with {} stall checks (overloaded?); measuring again",
                                w[0], w[2]
                            );
                            res = measure(&comms, kind, len);
                        }
                        _ => break,
                    }
                }
                match res {
                    Ok([0, _, _, 0]) => {
                        println!(
                            "{what}: 0 allocations and 0 registrations in {MEASURED} rounds of start + wait"
                        );
                    }
                    Ok([a, b, _, r]) => {
                        println!(
                            "{what}: {a} allocations ({b} bytes), {r} registrations in {MEASURED} rounds"
                        );
                        failures.push(format!("{what}: {a} allocations, {r} registrations"));
                    }
                    Err(e) => {
                        println!("{what}: failed: {e}");
                        failures.push(format!("{what}: {e}"));
                    }
                }
            }
        }
    }
    if !failures.is_empty() {
        eprintln!(
            "put and get rounds allocated or registered (rerun with GW_ALLOC_TRACE=1 for backtraces):\n  {}",
            failures.join("\n  ")
        );
        std::process::exit(1);
    }
    println!("transfer_no_alloc: every steady-state round allocated and registered nothing");
}
