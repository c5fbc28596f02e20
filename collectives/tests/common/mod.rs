//! Inputs and checks shared by the all-reduce integration tests.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, DType, RedOp, TransportChoice};

/// Rank `r`'s element `i` in call `k`: small integers, so float sums are exact.
pub fn input(r: u32, k: usize, i: usize) -> f32 {
    ((r as usize * 7 + k * 3 + i) % 61) as f32
}

pub fn expected(n: u32, k: usize, i: usize) -> f32 {
    (0..n).map(|r| input(r, k, i)).sum()
}

/// Whether `x` is the result of `op` for element `i` of call `k`: sums of
/// small integers are exact, averages within rounding of the division.
pub fn right(op: RedOp, n: u32, k: usize, i: usize, x: f32) -> bool {
    let sum = expected(n, k, i);
    match op {
        RedOp::Avg => (x - sum / n as f32).abs() <= 1e-6 * sum.abs().max(1.0),
        _ => x == sum,
    }
}

/// Runs `body` on every rank's communicator, each on a thread of its own (a
/// collective needs all ranks calling at once), and panics naming `what` and
/// the error of the first rank that returned one.
pub fn on_each_rank<F>(comms: Vec<Communicator>, what: &str, body: F)
where
    F: Fn(Communicator) -> Result<(), String> + Clone + Send + 'static,
{
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let body = body.clone();
            std::thread::spawn(move || body(c))
        })
        .collect();
    for t in threads {
        if let Err(e) = t.join().expect("rank thread") {
            panic!("{what}: {e}");
        }
    }
}

/// Runs `body` on both ranks of a local 2-rank world over transport `t`,
/// as [`on_each_rank`] does.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn on_two_ranks<F>(t: TransportChoice, key: &str, body: F)
where
    F: Fn(Communicator) -> Result<(), String> + Clone + Send + 'static,
{
    let (_store, comms) =
        local_world(2, key, |_, cfg| cfg.transport.set(t)).expect("communicators");
    on_each_rank(comms, key, body);
}

/// Writes `v` as element `i` of `buf`, whose elements are `dtype` (f32,
/// f64 or i32).
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn put(dtype: DType, buf: &mut [u8], i: usize, v: f64) {
    match dtype {
        DType::F32 => buf[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_ne_bytes()),
        DType::F64 => buf[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes()),
        DType::I32 => buf[i * 4..i * 4 + 4].copy_from_slice(&(v as i32).to_ne_bytes()),
        other => panic!("put: {other:?} is not a test type"),
    }
}

/// Element `i` of `buf` (as [`put`] wrote it).
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn get(dtype: DType, buf: &[u8], i: usize) -> f64 {
    let b = |w: usize| &buf[i * w..i * w + w];
    match dtype {
        DType::F32 => f64::from(f32::from_ne_bytes(b(4).try_into().unwrap_or([0; 4]))),
        DType::F64 => f64::from_ne_bytes(b(8).try_into().unwrap_or([0; 8])),
        DType::I32 => f64::from(i32::from_ne_bytes(b(4).try_into().unwrap_or([0; 4]))),
        other => panic!("get: {other:?} is not a test type"),
    }
}

/// `op` over the ranks' values `xs` (`n` of them), in f64.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn fold(op: RedOp, xs: impl Iterator<Item = f64>, n: u32) -> f64 {
    let xs: Vec<f64> = xs.collect();
    match op {
        RedOp::Sum => xs.iter().sum(),
        RedOp::Prod => xs.iter().product(),
        RedOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
        RedOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        RedOp::Avg => xs.iter().sum::<f64>() / f64::from(n),
        RedOp::None => panic!("fold: no operator"),
    }
}

/// Rank `r`'s element `i` of call `k`: 1, 2 or 3, so sums, products and
/// averages are exact in every type and every order of summation.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn small(r: u32, k: usize, i: usize) -> f64 {
    ((r as usize * 5 + k + i * 7) % 3 + 1) as f64
}

/// A local world over shared memory, each rank's config then changed by
/// `configure`.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn shm_world(
    n: u32,
    key: &str,
    configure: impl Fn(u32, &mut gw_collectives::Config),
) -> (gw_rendezvous::StoreServer, Vec<Communicator>) {
    local_world(n, key, |r, cfg| {
        cfg.transport.set(TransportChoice::Shm);
        configure(r, cfg);
    })
    .expect("communicators")
}

/// `GW_TEST_SEED`, else `default`; printed, so a failing run can be
/// repeated.
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("GW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("seed {seed} (GW_TEST_SEED)");
    seed
}

/// Whether `got` is `want`: exactly, or within float rounding where the
/// result is `inexact` (an average, a weighted sum).
#[allow(dead_code)] // Not every test file that shares this module uses it.
pub fn agrees(got: f64, want: f64, inexact: bool) -> bool {
    let tol = if inexact {
        1e-5 * want.abs().max(1.0)
    } else {
        0.0
    };
    (got - want).abs() <= tol
}
