//! `gwtest`: the rank program the multi-process tests launch.
//!
//! Each subcommand is one scenario run by every rank of a job; it prints a
//! line per rank and exits non-zero on any wrong byte or error, printing the
//! error text so that tests can check what it names.

use gw_allreduce::{Communicator, RedOp};
use std::process::ExitCode;
use std::time::Instant;

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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else {
        eprintln!(
            "usage: gwtest exchange [SIZES...] | kill-mid-transfer VICTIM | mismatch | collective-mismatch | init"
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
        "mismatch" => mismatch(&comm),
        "collective-mismatch" => collective_mismatch(&comm),
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
