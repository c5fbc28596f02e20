//! `gwtest`: the rank program the multi-process tests launch.
//!
//! Each subcommand is one scenario run by every rank of a job; it prints a
//! line per rank and exits non-zero on any wrong byte or error, printing the
//! error text so that tests can check what it names.

use gw_collectives::{Communicator, DType, Error, OpKind, RawOp, RedOp};
use gw_tests::coll::{self, Case};
use rand::{Rng, SeedableRng};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn pattern(src: u32, dst: u32, len: usize, i: usize) -> u8 {
    ((src as usize * 131 + dst as usize * 31 + i * 7 + len) % 251) as u8
}

fn parse_sizes(args: &[String]) -> Vec<usize> {
    if args.is_empty() {
        return vec![0, 1, 4095, (1 << 20) + 3];
    }
    args.iter().filter_map(|a| parse_size(a)).collect()
}

fn parse_size(a: &str) -> Option<usize> {
    let (num, mult) = match a.chars().last()? {
        'K' | 'k' => (&a[..a.len() - 1], 1 << 10),
        'M' | 'm' => (&a[..a.len() - 1], 1 << 20),
        'G' | 'g' => (&a[..a.len() - 1], 1 << 30),
        _ => (a, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

/// Every rank exchanges a distinct pattern with every other rank, for each size.
fn exchange(comm: &Communicator, sizes: &[usize]) -> Result<String, String> {
    let (r, n) = (comm.rank(), comm.size());
    let mut checked = 0usize;
    for &len in sizes {
        let mut recv = vec![0u8; len];
        for k in 1..n {
            let to = (r + k) % n;
            let from = (r + n - k) % n;
            let send: Vec<u8> = (0..len).map(|i| pattern(r, to, len, i)).collect();
            recv.fill(0);
            comm.sendrecv(&send, to, &mut recv, from)
                .map_err(|e| e.to_string())?;
            if let Some(i) = (0..len).find(|&i| recv[i] != pattern(from, r, len, i)) {
                return Err(format!(
                    "wrong byte {i} of {len} from rank {from}: got {}, want {}",
                    recv[i],
                    pattern(from, r, len, i)
                ));
            }
            checked += len;
        }
    }
    Ok(format!(
        "exchange ok: {} sizes, {checked} bytes checked, transports {}",
        sizes.len(),
        comm.transport_summary()
    ))
}

/// Every rank posts its sends to and receives from every other rank in an
/// order of its own (in the first iteration all sends first, as two MPI
/// ranks swapping buffers with `Isend` then `Irecv` do), with a
/// non-blocking all-reduce among them, and only then waits, in another
/// order of its own: no message may wait for the order its peer posted in.
fn p2p_overlap(comm: &Communicator, iters: usize) -> Result<String, String> {
    use rand::seq::SliceRandom;
    let (r, n) = (comm.rank(), comm.size());
    let e = |e: Error| e.to_string();
    // The sizes are the same draw on every rank; the orders are each rank's own.
    let mut shared = rand::rngs::StdRng::seed_from_u64(0xb2b);
    let mut own = rand::rngs::StdRng::seed_from_u64(0x1000 + u64::from(r));
    let mut checked = 0usize;
    let peers: Vec<u32> = (0..n).filter(|&p| p != r).collect();
    for it in 0..iters {
        let lens: Vec<Vec<usize>> = (0..n)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        if shared.random_bool(0.5) {
                            shared.random_range(0..8192)
                        } else {
                            shared.random_range(256 << 10..4 << 20)
                        }
                    })
                    .collect()
            })
            .collect();
        let mark = |src: u32, dst: u32, len: usize, i: usize| pattern(src, dst, len, i) ^ it as u8;
        let sends: Vec<Vec<u8>> = peers
            .iter()
            .map(|&to| {
                let len = lens[r as usize][to as usize];
                (0..len).map(|i| mark(r, to, len, i)).collect()
            })
            .collect();
        let mut recvs: Vec<Vec<u8>> = peers
            .iter()
            .map(|&from| vec![0u8; lens[from as usize][r as usize]])
            .collect();
        // Posts: (is_send, index into peers); sends first in iteration 0.
        let mut posts: Vec<(bool, usize)> = (0..peers.len())
            .flat_map(|k| [(true, k), (false, k)])
            .collect();
        if it == 0 {
            posts.sort_by_key(|&(send, _)| !send);
        } else {
            posts.shuffle(&mut own);
        }
        let reduce_at = own.random_range(0..=posts.len());
        let mut handles = Vec::with_capacity(posts.len());
        let mut reduce = None;
        for (j, &(is_send, k)) in posts.iter().enumerate() {
            if j == reduce_at {
                reduce = Some(
                    comm.iall_reduce(vec![i64::from(r) + it as i64; 1000], RedOp::Sum, None)
                        .map_err(e)?,
                );
            }
            let peer = peers[k];
            // SAFETY: `sends` and `recvs` are neither moved nor touched
            // until every handle has been waited for below.
            let h = unsafe {
                if is_send {
                    let b = &sends[k];
                    comm.sendrecv_raw(DType::U8, Some((peer, b.as_ptr(), b.len())), None)
                } else {
                    let b = &mut recvs[k];
                    comm.sendrecv_raw(DType::U8, None, Some((peer, b.as_mut_ptr(), b.len())))
                }
            }
            .map_err(e)?;
            handles.push((is_send, peer, h));
        }
        let reduce = match reduce {
            Some(p) => p,
            None => comm
                .iall_reduce(vec![i64::from(r) + it as i64; 1000], RedOp::Sum, None)
                .map_err(e)?,
        };
        handles.shuffle(&mut own);
        for (is_send, peer, h) in &handles {
            let dir = if *is_send { "send to" } else { "receive from" };
            h.wait()
                .map_err(|err| format!("iteration {it}: {dir} rank {peer}: {err}"))?;
        }
        let want: i64 = (0..i64::from(n)).map(|q| q + it as i64).sum();
        if let Some(x) = reduce.wait().map_err(e)?.iter().find(|&&x| x != want) {
            return Err(format!("iteration {it}: all-reduce gave {x}, want {want}"));
        }
        for (k, &from) in peers.iter().enumerate() {
            let got = &recvs[k];
            let len = got.len();
            if let Some(i) = (0..len).find(|&i| got[i] != mark(from, r, len, i)) {
                return Err(format!(
                    "iteration {it}: wrong byte {i} of {len} from rank {from}: got {}, want {}",
                    got[i],
                    mark(from, r, len, i)
                ));
            }
            checked += len;
        }
    }
    Ok(format!(
        "p2p-overlap ok: {iters} iterations, {checked} bytes checked, transports {}",
        comm.transport_summary()
    ))
}

/// Rank `victim` dies by SIGKILL in the middle of a large exchange; the others
/// must report an error naming it.
fn kill_mid_transfer(comm: &Communicator, victim: u32) -> Result<String, String> {
    let (r, n) = (comm.rank(), comm.size());
    let len = 64 << 20;
    let send = vec![1u8; len];
    let mut recv = vec![0u8; len];
    if r == victim {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            // SAFETY: raising a signal on our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
    }
    let started = Instant::now();
    for _ in 0..1000 {
        comm.sendrecv(&send, (r + 1) % n, &mut recv, (r + n - 1) % n)
            .map_err(|e| format!("error after {:.2}s: {e}", started.elapsed().as_secs_f64()))?;
    }
    Ok("no error".into())
}

/// Rounds of a persistent all-reduce of `count` floats (16 MiB unless
/// given) while `victim` kills itself 30 ms in: every other rank must fail,
/// naming it.
fn kill_mid_persistent(comm: &Communicator, victim: u32, count: usize) -> Result<String, String> {
    let mut send = vec![1f32; count];
    let mut recv = vec![0f32; count];
    let mut req = comm
        .all_reduce_init(&mut send, &mut recv, RedOp::Sum)
        .map_err(|e| format!("init: {e}"))?;
    println!(
        "persistent all-reduce of {count} floats, host rounds: {}",
        req.on_host()
    );
    if comm.rank() == victim {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            // SAFETY: raising a signal on our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
    }
    let started = Instant::now();
    for _ in 0..100_000 {
        req.start()
            .and_then(|_| req.wait())
            .map_err(|e| format!("error after {:.2}s: {e}", started.elapsed().as_secs_f64()))?;
    }
    Ok("no error".into())
}

/// 8-byte all-reduces (the host region's, where every rank is on this host
/// over shared memory) while `victim` kills itself 30 ms in: every other
/// rank must fail, naming it.
fn kill_mid_small(comm: &Communicator, victim: u32) -> Result<String, String> {
    println!("host region: {}", comm.host_coll_rounds().is_some());
    if comm.rank() == victim {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            // SAFETY: raising a signal on our own process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
    }
    let started = Instant::now();
    let mut x = [1.0f64];
    for _ in 0..100_000_000u64 {
        comm.all_reduce_in_place(&mut x, RedOp::Max)
            .map_err(|e| format!("error after {:.2}s: {e}", started.elapsed().as_secs_f64()))?;
    }
    Ok("no error".into())
}

/// Rank 0 sends f32, rank 1 expects i32: the receiver must name both.
fn mismatch(comm: &Communicator) -> Result<String, String> {
    match comm.rank() {
        0 => comm.send(1, &[1.0f32; 10]).map_err(|e| e.to_string())?,
        1 => {
            let mut b = [0i32; 10];
            comm.recv(0, &mut b).map_err(|e| e.to_string())?
        }
        _ => {}
    }
    comm.barrier().map_err(|e| e.to_string())?;
    Ok("no error".into())
}

/// Rank 0 calls all_reduce, rank 1 calls broadcast: every rank gets an error.
fn collective_mismatch(comm: &Communicator) -> Result<String, String> {
    let mut buf = vec![1.0f32; 1000];
    if comm.rank() == 0 {
        comm.all_reduce_in_place(&mut buf, RedOp::Sum)
            .map_err(|e| e.to_string())?;
    } else {
        comm.broadcast(&mut buf, 0).map_err(|e| e.to_string())?;
    }
    Ok("no error".into())
}

/// The Gloo-style matrix: every collective × dtype × op × count × placement.
/// `--big-only DTYPES` restricts counts of 100,000 and more to those dtypes
/// (the large world sizes on a 2-core CI machine).
fn collectives(comm: &Communicator, args: &[String]) -> Result<String, String> {
    let (big_only, rest): (Option<Vec<DType>>, &[String]) = match args {
        [flag, list, rest @ ..] if flag == "--big-only" => (
            Some(list.split(',').filter_map(DType::parse).collect()),
            rest,
        ),
        _ => (None, args),
    };
    let cases: Vec<Case> = coll::matrix(comm.size(), &parse_sizes(rest))
        .into_iter()
        .filter(|c| c.count < 100_000 || big_only.as_ref().is_none_or(|d| d.contains(&c.dtype)))
        .collect();
    run_cases(comm, &cases, "collectives")
}

/// Runs `cases` in order, checking every result, and says "`what` ok".
fn run_cases(comm: &Communicator, cases: &[Case], what: &str) -> Result<String, String> {
    let mut wrong = 0;
    for c in cases {
        let w = coll::run_case(comm, c)?;
        if w > 0 {
            println!("rank {}: {w} wrong elements in {c:?}", comm.rank());
        }
        wrong += w;
    }
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements over {} cases", cases.len()));
    }
    Ok(format!(
        "{what} ok: {} cases, transports {}",
        cases.len(),
        comm.transport_summary()
    ))
}

/// Only the all-reduce cases of the matrix (every dtype × operator ×
/// placement, weighted and not), so that the connections a job makes are the
/// ones its all-reduce algorithm needs: the hierarchical test checks which
/// peers each rank dials.
fn all_reduces(comm: &Communicator, args: &[String]) -> Result<String, String> {
    let cases: Vec<Case> = coll::matrix(comm.size(), &parse_sizes(args))
        .into_iter()
        .filter(|c| c.kind == OpKind::AllReduce)
        .collect();
    run_cases(comm, &cases, "all-reduce")
}

/// Several non-blocking operations outstanding at once, waited in reverse.
fn nonblocking(comm: &Communicator) -> Result<String, String> {
    let (r, n) = (comm.rank(), comm.size());
    let e = |e: Error| e.to_string();
    let mut pend = Vec::new();
    for k in 0..6usize {
        let len = 1000 * (k + 1) + 13;
        let v: Vec<f32> = (0..len).map(|i| (r as usize + i + k) as f32).collect();
        pend.push((k, len, comm.iall_reduce(v, RedOp::Sum, None).map_err(e)?));
    }
    let bc = comm.ibroadcast(vec![r as f64; 777], n - 1).map_err(e)?;
    let ag = comm
        .iall_gather(vec![r as i64; 5], vec![0i64; 5 * n as usize])
        .map_err(e)?;
    let (_, g) = ag.wait().map_err(e)?;
    let b = bc.wait().map_err(e)?;
    if b.iter().any(|x| *x != (n - 1) as f64)
        || (0..n as usize).any(|q| g[q * 5..q * 5 + 5].iter().any(|x| *x != q as i64))
    {
        return Err("wrong broadcast or all-gather result".into());
    }
    while let Some((k, len, p)) = pend.pop() {
        let v = p.wait().map_err(e)?;
        for (i, x) in v.iter().enumerate().take(len) {
            let want: usize = (0..n as usize).map(|q| q + i + k).sum();
            if *x != want as f32 {
                return Err(format!("iall_reduce {k}: element {i} is {x}, want {want}"));
            }
        }
    }
    Ok("nonblocking ok".into())
}

/// Random collectives with random sizes and roots; every rank draws the same sequence.
fn stress(comm: &Communicator, iters: usize) -> Result<String, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let kinds = [
        OpKind::AllReduce,
        OpKind::ReduceScatter,
        OpKind::AllGather,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::Barrier,
    ];
    let ops = [RedOp::Sum, RedOp::Max, RedOp::Min, RedOp::Prod];
    for it in 0..iters {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let count = if rng.random_bool(0.8) {
            rng.random_range(0..2000)
        } else {
            rng.random_range(0..200_000)
        };
        let c = Case {
            kind,
            dtype: [DType::F32, DType::I32, DType::F64, DType::Bf16][rng.random_range(0..4)],
            op: ops[rng.random_range(0..ops.len())],
            count,
            root: rng.random_range(0..comm.size()),
            in_place: rng.random_bool(0.5),
            weighted: false,
        };
        let wrong = coll::run_case(comm, &c)?;
        if wrong > 0 {
            return Err(format!("iteration {it}: {wrong} wrong elements in {c:?}"));
        }
    }
    Ok(format!("stress ok: {iters} random collectives"))
}

/// Bad calls fail locally with a clear error before anything is sent, and
/// the communicator stays usable.
fn refusals(comm: &Communicator) -> Result<String, String> {
    let mut errors = Vec::new();
    let mut ints = vec![1i32; 10];
    errors.push(comm.all_reduce_in_place(&mut ints, RedOp::Avg).err());
    errors.push(comm.all_reduce_weighted_in_place(&mut ints, 0.5).err());
    let mut short = vec![0f32; 3];
    errors.push(comm.all_reduce(&[1f32; 4], &mut short, RedOp::Sum).err());
    errors.push(comm.broadcast(&mut short, comm.size()).err());
    let huge = RawOp {
        kind: OpKind::AllReduce,
        dtype: DType::F64,
        redop: RedOp::Sum,
        count: usize::MAX / 4,
        root: 0,
        send: std::ptr::null(),
        recv: std::ptr::null_mut(),
        weight: None,
    };
    // SAFETY: refused before any memory is touched.
    errors.push(unsafe { comm.submit_raw(huge, None) }.err());
    let mut lines = Vec::new();
    for (i, e) in errors.into_iter().enumerate() {
        match e {
            Some(e @ Error::InvalidArgument(_)) => lines.push(e.to_string()),
            Some(e) => return Err(format!("case {i}: wrong error kind: {e}")),
            None => return Err(format!("case {i}: bad call was accepted")),
        }
    }
    let mut v = vec![1f32; 100];
    comm.all_reduce_in_place(&mut v, RedOp::Sum)
        .map_err(|e| e.to_string())?;
    if v.iter().any(|x| *x != comm.size() as f32) {
        return Err("communicator unusable after refused calls".into());
    }
    Ok(format!("refusals ok: {}", lines.join(" | ")))
}

/// Many small tensors through the fusion buffer equal their one-by-one all-reduces.
fn fusion(comm: &Communicator) -> Result<String, String> {
    let e = |e: Error| e.to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let r = comm.rank() as f32;
    let mut tensors: Vec<Vec<f32>> = (0..200)
        .map(|k| {
            let len = if k % 50 == 49 {
                300_000
            } else {
                rng.random_range(0..3000)
            };
            (0..len).map(|i| r + ((i + k) % 5) as f32).collect()
        })
        .collect();
    let mut singles = tensors.clone();
    for t in singles.iter_mut() {
        comm.all_reduce_weighted_in_place(t, 0.5).map_err(e)?;
    }
    let mut views: Vec<&mut [f32]> = tensors.iter_mut().map(|t| t.as_mut_slice()).collect();
    comm.all_reduce_fused(&mut views, RedOp::Sum, Some(0.5))
        .map_err(e)?;
    if tensors != singles {
        return Err("fused results differ from one-by-one all-reduces".into());
    }
    let elems: usize = tensors.iter().map(Vec::len).sum();
    Ok(format!(
        "fusion ok: {} tensors, {elems} elements",
        tensors.len()
    ))
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) } != 0 {
        return f64::NAN;
    }
    // SAFETY: initialised by the successful call above.
    let u = unsafe { u.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// After some work, an idle communicator must stop spinning: CPU used over
/// three idle seconds, as a fraction of one core.
fn idle_cpu(comm: &Communicator) -> Result<String, String> {
    let mut v = vec![1.0f32; 1 << 16];
    for _ in 0..20 {
        comm.all_reduce_in_place(&mut v, RedOp::Sum)
            .map_err(|e| e.to_string())?;
    }
    let idle = Duration::from_secs(3);
    let c0 = cpu_seconds();
    let t0 = Instant::now();
    std::thread::sleep(idle);
    let frac = (cpu_seconds() - c0) / t0.elapsed().as_secs_f64();
    comm.barrier().map_err(|e| e.to_string())?;
    if frac.is_nan() || frac >= 0.01 {
        return Err(format!(
            "idle communicator used {:.2}% of a core",
            frac * 100.0
        ));
    }
    Ok(format!("idle cpu {:.3}% of a core", frac * 100.0))
}

/// A training loop's rhythm: a checked 256 KiB all-reduce, then 20 ms of
/// "compute" (a sleep), `steps` times. For tests that need ranks alive and
/// communicating for a long time without taking the processors (a
/// scheduler's time limit ending them, say). A count, not a clock, ends it,
/// so that every rank stops after the same all-reduce. Prints `paced ready`
/// once this rank is past its first all-reduce (so every rank is past init).
fn paced(comm: &Communicator, steps: u64) -> Result<String, String> {
    let n = comm.size() as f32;
    let mut v = vec![0.0f32; 1 << 16];
    for step in 0..steps {
        v.fill(1.0);
        comm.all_reduce_in_place(&mut v, RedOp::Sum)
            .map_err(|e| format!("step {step}: {e}"))?;
        if let Some(i) = v.iter().position(|&x| x != n) {
            return Err(format!("step {step}: element {i} is {}, want {n}", v[i]));
        }
        if step == 0 {
            use std::io::Write;
            println!("rank {}: paced ready", comm.rank());
            let _ = std::io::stdout().flush();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(format!("paced: {steps} steps, nothing stopped it"))
}

/// The cost model this rank chooses with and its choice per size, on one line,
/// so a test can check that every rank uses rank 0's.
fn model_choices(comm: &Communicator) -> String {
    let choices: Vec<String> = [8usize, 4096, 65536, 1 << 20, 64 << 20]
        .iter()
        .map(|&b| format!("{b}:{}", comm.choose_algo(b).name()))
        .collect();
    format!("model {} choices {}", comm.cost_model(), choices.join(","))
}

/// Keeps the buffers a scenario frees in the heap for its next case: the
/// matrix allocates and frees vectors of up to 8 MiB hundreds of times, and
/// with glibc's defaults each is a fresh mapping whose page faults, zeroing
/// and unmapping took about a quarter of a 4-rank run (`perf`). Buffer
/// addresses still vary case to case, which the copies' alignment paths
/// want.
#[cfg(target_env = "gnu")]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets glibc's thresholds; no other thread exists
    // yet. A refused value (0 returned) leaves the default, which is correct,
    // only slower.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Other C libraries keep their own policy.
#[cfg(not(target_env = "gnu"))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    keep_freed_memory();
    gw_logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else {
        eprintln!(
            "usage: gwtest exchange [SIZES...] | collectives [SIZES...] | all-reduce [SIZES...] | kill-mid-transfer VICTIM | kill-mid-persistent VICTIM [COUNT] | kill-mid-small VICTIM | p2p-overlap [ITERS] | mismatch | collective-mismatch | paced [STEPS] | init"
        );
        return ExitCode::from(2);
    };
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("init error: {e}");
            return ExitCode::from(1);
        }
    };
    let res = match cmd.as_str() {
        "init" => Ok(format!("init ok: rank {} of {}", comm.rank(), comm.size())),
        "exchange" => exchange(&comm, &parse_sizes(&args[1..])),
        "kill-mid-transfer" => {
            kill_mid_transfer(&comm, args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1))
        }
        "kill-mid-persistent" => kill_mid_persistent(
            &comm,
            args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1),
            args.get(2).and_then(|v| v.parse().ok()).unwrap_or(4 << 20),
        ),
        "kill-mid-small" => {
            kill_mid_small(&comm, args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1))
        }
        "mismatch" => mismatch(&comm),
        "collective-mismatch" => collective_mismatch(&comm),
        "collectives" => collectives(&comm, &args[1..]),
        "all-reduce" => all_reduces(&comm, &args[1..]),
        "nonblocking" => nonblocking(&comm),
        "p2p-overlap" => p2p_overlap(
            &comm,
            args.get(1).and_then(|v| v.parse().ok()).unwrap_or(20),
        ),
        "stress" => stress(
            &comm,
            args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1000),
        ),
        "refusals" => refusals(&comm),
        "fusion" => fusion(&comm),
        "model" => Ok(model_choices(&comm)),
        "idle-cpu" => idle_cpu(&comm),
        "paced" => match args.get(1).map(|v| v.parse::<u64>()) {
            None => paced(&comm, 1000),
            Some(Ok(steps)) => paced(&comm, steps),
            Some(Err(_)) => Err(format!("paced: {:?} is not a number of steps", args[1])),
        },
        other => Err(format!("unknown scenario {other}")),
    };
    match res {
        Ok(msg) => {
            println!("rank {}: {msg}", comm.rank());
            ExitCode::SUCCESS
        }
        Err(msg) => {
            println!("rank {} error: {msg}", comm.rank());
            ExitCode::from(1)
        }
    }
}
