//! Inputs and checks shared by the all-reduce integration tests.

use gw_collectives::local::local_world;
use gw_collectives::{Communicator, RedOp, TransportChoice};

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
