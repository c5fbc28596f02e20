//! `gwbench p2p --op send [--bidir] [--lat]`: the point-to-point benchmark
//! in perftest's shape (ib_send_bw, ib_send_lat), so that scripts written
//! for those tools read gradwire's figures.
//!
//! Bandwidth rows are `#bytes #iterations BW peak[GB/sec] BW average[GB/sec]
//! MsgRate[Mpps]`. The iterations go in [`WINDOWS`] windows of back-to-back
//! messages, each closed by a one-byte acknowledgement. Average is all bytes
//! over all windows' time, peak is the best window, and the message rate is
//! messages over all time. With `--bidir` both ranks stream at once, and
//! bytes and messages count both ways over the slower rank's time.
//!
//! Latency rows are `#bytes #iterations t_min[usec] t_max[usec]
//! t_typical[usec] t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9%
//! percentile[usec]`, where each sample is half of one round trip timed by
//! rank 0, and typical is the median, as in perftest.
//!
//! GB is 1e9 bytes, as everywhere in gwbench.

use crate::Fail;
use crate::args::{P2pOp, P2pOpts, Perftest};
use crate::p2p::{P2p, XferError};
use gw_collectives::Error;
use std::time::Instant;

/// Windows a bandwidth measurement is cut into (fewer when there are fewer
/// iterations).
pub const WINDOWS: usize = 8;

/// Summary of latency samples, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatStats {
    pub min: f64,
    pub max: f64,
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The value at fraction `q` of `sorted` (nearest rank, as perftest).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Statistics of `samples` (microseconds); `None` for no samples.
pub fn lat_stats(samples: &[f64]) -> Option<LatStats> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let avg = s.iter().sum::<f64>() / n;
    let var = s.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n;
    Some(LatStats {
        min: s[0],
        max: s[s.len() - 1],
        typical: s[s.len() / 2],
        avg,
        stdev: var.sqrt(),
        p99: percentile(&s, 0.99),
        p999: percentile(&s, 0.999),
    })
}

/// (peak, average) GB/s and Mpps of windows of `(messages, seconds)`, each
/// message `size` bytes, `ways` directions.
pub fn bw_stats(size: usize, ways: usize, windows: &[(usize, f64)]) -> (f64, f64, f64) {
    let total_s: f64 = windows.iter().map(|w| w.1).sum();
    let msgs: usize = windows.iter().map(|w| w.0).sum::<usize>() * ways;
    let bytes = (msgs * size) as f64;
    let peak = windows
        .iter()
        .filter(|w| w.1 > 0.0)
        .map(|w| (w.0 * ways * size) as f64 / w.1 / 1e9)
        .fold(0.0, f64::max);
    let avg = if total_s > 0.0 {
        bytes / total_s / 1e9
    } else {
        0.0
    };
    let rate = if total_s > 0.0 {
        msgs as f64 / total_s / 1e6
    } else {
        0.0
    };
    (peak, avg, rate)
}

pub fn bw_columns() -> String {
    format!(
        " {:<10} {:<13} {:<18} {:<21} {}",
        "#bytes", "#iterations", "BW peak[GB/sec]", "BW average[GB/sec]", "MsgRate[Mpps]"
    )
}

pub fn bw_row(size: usize, iters: usize, peak: f64, avg: f64, rate: f64) -> String {
    format!(" {size:<10} {iters:<13} {peak:<18.2} {avg:<21.2} {rate:.6}")
}

pub fn lat_columns() -> String {
    format!(
        " {:<10} {:<13} {:<14} {:<14} {:<16} {:<14} {:<16} {:<22} {}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_max[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_stdev[usec]",
        "99% percentile[usec]",
        "99.9% percentile[usec]"
    )
}

pub fn lat_row(size: usize, iters: usize, s: &LatStats) -> String {
    format!(
        " {size:<10} {iters:<13} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<16.2} {:<22.2} {:.2}",
        s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

/// Runs the perftest-shaped benchmark; `print` writes rank 0's lines.
pub fn run(b: &mut P2p<'_>, o: &P2pOpts, pt: &Perftest, print: &dyn Fn(&str)) -> Result<(), Fail> {
    match (pt.op, pt.lat) {
        (P2pOp::Write | P2pOp::Read, false) => return run_one_sided(b, o, pt, print),
        (P2pOp::Write, true) => return run_write_lat(b, o, print),
        (P2pOp::Read, true) => return run_read_lat(b, o, print),
        (P2pOp::Send, _) => {}
    }
    let lib = |what: &'static str, size: usize| lib_err("send", what, size);
    let columns = if pt.lat { lat_columns() } else { bw_columns() };
    print(&columns);
    for size in o.sizes.seq() {
        if pt.lat {
            let samples = latency_samples(o, "send", size, "round trip", 2.0, || b.round(size))?;
            if let Some(s) = lat_stats(&samples) {
                print(&lat_row(size, o.iters, &s));
            }
            continue;
        }
        let stream = |b: &mut P2p<'_>, k: usize| {
            if pt.bidir {
                b.both_ways(size, k)
            } else {
                b.stream(size, k)
            }
        };
        if o.warmup > 0 {
            stream(b, o.warmup).map_err(lib("warm-up", size))?;
        }
        let nwin = WINDOWS.min(o.iters.max(1));
        let mut windows = Vec::with_capacity(nwin);
        let mut left = o.iters;
        for w in 0..nwin {
            let k = left / (nwin - w);
            left -= k;
            if k == 0 {
                continue;
            }
            let secs = stream(b, k).map_err(lib("stream", size))?;
            windows.push((k, secs));
        }
        let (peak, avg, rate) = bw_stats(size, if pt.bidir { 2 } else { 1 }, &windows);
        print(&bw_row(size, o.iters, peak, avg, rate));
    }
    Ok(())
}

/// `--op write` and `--op read`: ib_write_bw and ib_read_bw through the
/// communicator. Per size, one persistent put (`Communicator::put_init`)
/// or get (`get_init`) whose round is `k` writes of the message into the
/// peer's buffer, or `k` reads of the peer's, `k` the iterations of a
/// window; the windows are its rounds. Rank 0's bytes move to rank 1 (and
/// rank 1's to rank 0 with `--bidir`): rank 0 writes, or rank 1 reads. A
/// round's time is the slower rank's (a writer's ends when its writes
/// complete, a target's when they have landed; a reader's when its reads
/// have, an owner's when the reader says so). Planning (registration, the
/// exchange of keys) is not timed, as perftest's connection setup is not.
fn run_one_sided(
    b: &mut P2p<'_>,
    o: &P2pOpts,
    pt: &Perftest,
    print: &dyn Fn(&str),
) -> Result<(), Fail> {
    let name = if pt.op == P2pOp::Read {
        "read"
    } else {
        "write"
    };
    let lib = |what: &'static str, size: usize| lib_err(name, what, size);
    print(&bw_columns());
    for size in o.sizes.seq() {
        if size == 0 {
            continue;
        }
        let nwin = WINDOWS.min(o.iters.max(1));
        let k = (o.iters / nwin).max(1);
        let (sends, recvs) = (b.me == 0 || pt.bidir, b.me == 1 || pt.bidir);
        fresh_message(b, size);
        let send = if sends { &b.send[..size] } else { &[][..] };
        let recv = if recvs {
            &mut b.recv[..size]
        } else {
            &mut [][..]
        };
        let mut put = if pt.op == P2pOp::Read {
            b.comm
                .get_init(send, recv, k)
                .map_err(lib("get_init", size))?
        } else {
            b.comm
                .put_init(send, recv, k)
                .map_err(lib("put_init", size))?
        };
        if o.warmup > 0 {
            put.start()
                .and_then(|_| put.wait())
                .map_err(lib("warm-up", size))?;
        }
        let mut mine = Vec::with_capacity(nwin);
        for _ in 0..nwin {
            let t0 = Instant::now();
            put.start()
                .and_then(|_| put.wait())
                .map_err(lib("round", size))?;
            mine.push(t0.elapsed().as_secs_f64());
        }
        drop(put);
        let mut theirs = vec![0.0f64; nwin];
        b.comm
            .sendrecv(&mine, b.peer, &mut theirs, b.peer)
            .map_err(lib("time exchange", size))?;
        let windows: Vec<(usize, f64)> = mine
            .iter()
            .zip(&theirs)
            .map(|(a, t)| (k, a.max(*t)))
            .collect();
        if o.check && recvs {
            check_landed(b, size, &format!("p2p --op {name}"))?;
        }
        let (peak, avg, rate) = bw_stats(size, if pt.bidir { 2 } else { 1 }, &windows);
        print(&bw_row(size, k * nwin, peak, avg, rate));
    }
    Ok(())
}

/// The error of a library call in `p2p --op OP`: `what` (a call's name)
/// for a message of `size` bytes. Its text is made only on an error: made
/// for every timed call, it was 7% of a ping-pong's cycles.
fn lib_err<'a, E: Into<XferError>>(
    op: &'a str,
    what: &'a str,
    size: usize,
) -> impl FnOnce(E) -> Fail + use<'a, E> {
    move |err| {
        err.into()
            .fail(format!("p2p --op {op} {what} of {size} bytes"))
    }
}

/// A latency test's samples: `o.warmup` untimed calls of `round`, then
/// `o.iters` timed ones, each sample a call's time in µs divided by `per`
/// (2 where a call is a round trip). `what` names a timed call in errors.
fn latency_samples<E: Into<XferError>>(
    o: &P2pOpts,
    op: &str,
    size: usize,
    what: &str,
    per: f64,
    mut round: impl FnMut() -> Result<(), E>,
) -> Result<Vec<f64>, Fail> {
    for _ in 0..o.warmup {
        round().map_err(lib_err(op, "warm-up", size))?;
    }
    let mut samples = Vec::with_capacity(o.iters);
    for _ in 0..o.iters {
        let t0 = Instant::now();
        round().map_err(lib_err(op, what, size))?;
        samples.push(t0.elapsed().as_secs_f64() * 1e6 / per);
    }
    Ok(samples)
}

/// Writes this rank's message of `size` bytes into `b.send` and spoils the
/// first `size` bytes of `b.recv`, so that `check_landed` sees only what a
/// transfer of this size brought.
fn fresh_message(b: &mut P2p<'_>, size: usize) {
    for (i, x) in b.send[..size].iter_mut().enumerate() {
        *x = crate::p2p::pattern(b.me, size, i);
    }
    b.recv[..size].fill(0xff);
}

/// Whether the first `size` bytes of `b.recv` are the peer's message.
fn check_landed(b: &P2p<'_>, size: usize, what: &str) -> Result<(), Fail> {
    let peer = b.peer;
    match (0..size).find(|&i| b.recv[i] != crate::p2p::pattern(peer, size, i)) {
        None => Ok(()),
        Some(i) => Err(Fail::Other(format!(
            "{what} of {size} bytes: byte {i} landed as {:#04x}, not rank {peer}'s {:#04x}",
            b.recv[i],
            crate::p2p::pattern(peer, size, i)
        ))),
    }
}

/// `--op write --lat`: ib_write_lat through the communicator. Per size,
/// two persistent puts of one write each, rank 0 to rank 1 ("ping") and
/// back ("pong"); rank 1 starts its write only once rank 0's has landed in
/// its buffer, and a sample is half of rank 0's time from starting its
/// write to rank 1's landing in its own buffer. So a sample holds what a
/// put round costs on top of the bytes (its O(1) handshake, the engine
/// noticing the landing), where ib_write_lat's ranks poll the buffer's last
/// byte themselves.
fn run_write_lat(b: &mut P2p<'_>, o: &P2pOpts, print: &dyn Fn(&str)) -> Result<(), Fail> {
    let lib = |what: &'static str, size: usize| lib_err("write --lat", what, size);
    print(&lat_columns());
    let (me, comm) = (b.me, b.comm);
    for size in o.sizes.seq() {
        if size == 0 {
            continue;
        }
        fresh_message(b, size);
        let (send, recv) = (&b.send[..size], &mut b.recv[..size]);
        let none: &[u8] = &[];
        let (ping_send, pong_send) = if me == 0 { (send, none) } else { (none, send) };
        let (ping_recv, pong_recv): (&mut [u8], &mut [u8]) = if me == 0 {
            (&mut [], recv)
        } else {
            (recv, &mut [])
        };
        let mut ping = comm
            .put_init(ping_send, ping_recv, 1)
            .map_err(lib("put_init", size))?;
        let mut pong = comm
            .put_init(pong_send, pong_recv, 1)
            .map_err(lib("put_init", size))?;
        let round_trip = || -> Result<(), Error> {
            ping.start()?;
            ping.wait()?;
            pong.start()?;
            pong.wait()
        };
        let samples = latency_samples(o, "write --lat", size, "round trip", 2.0, round_trip)?;
        drop((ping, pong));
        if o.check {
            check_landed(b, size, "p2p --op write --lat")?;
        }
        if let Some(s) = lat_stats(&samples) {
            print(&lat_row(size, o.iters, &s));
        }
    }
    Ok(())
}

/// `--op read --lat`: ib_read_lat through the communicator. Per size, one
/// persistent get of one read a round, rank 1 reading rank 0's buffer; a
/// sample is rank 1's round, from its start to its read's completion. A
/// read is a round trip by itself, so a sample is not halved; it also
/// holds the get's O(1) handshake (the owner's `Ready`, the reader's
/// `Done` of the round before), where ib_read_lat times the read alone.
fn run_read_lat(b: &mut P2p<'_>, o: &P2pOpts, print: &dyn Fn(&str)) -> Result<(), Fail> {
    let lib = |what: &'static str, size: usize| lib_err("read --lat", what, size);
    print(&lat_columns());
    let (me, comm) = (b.me, b.comm);
    for size in o.sizes.seq() {
        if size == 0 {
            continue;
        }
        fresh_message(b, size);
        let (expose, into): (&[u8], &mut [u8]) = if me == 0 {
            (&b.send[..size], &mut [])
        } else {
            (&[], &mut b.recv[..size])
        };
        let mut get = comm
            .get_init(expose, into, 1)
            .map_err(lib("get_init", size))?;
        let round = || -> Result<(), Error> {
            get.start()?;
            get.wait()
        };
        let samples = latency_samples(o, "read --lat", size, "read", 1.0, round)?;
        drop(get);
        if o.check && me == 1 {
            check_landed(b, size, "p2p --op read --lat")?;
        }
        // Rank 0's rounds only wait for the reader; rank 1's are the
        // samples, and rank 0 prints.
        let mut theirs = vec![0.0f64; samples.len()];
        comm.sendrecv(&samples, b.peer, &mut theirs, b.peer)
            .map_err(lib("sample exchange", size))?;
        let reader = if me == 1 { &samples } else { &theirs };
        if let Some(s) = lat_stats(reader) {
            print(&lat_row(size, o.iters, &s));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_by_hand() {
        let s: Vec<f64> = (1..=1000).map(f64::from).collect();
        let st = lat_stats(&s).unwrap();
        assert_eq!((st.min, st.max), (1.0, 1000.0));
        assert_eq!(
            st.typical, 501.0,
            "median: the upper middle of an even count"
        );
        assert_eq!(st.avg, 500.5);
        assert_eq!((st.p99, st.p999), (990.0, 999.0));
        assert!((st.stdev - 288.6749).abs() < 1e-3, "{}", st.stdev);
        assert_eq!(lat_stats(&[]), None);
        let one = lat_stats(&[3.0]).unwrap();
        assert_eq!((one.p99, one.p999, one.stdev), (3.0, 3.0, 0.0));
    }

    #[test]
    fn bandwidth_peak_average_and_rate() {
        // 1 MB messages: 10 in 0.01 s (1 GB/s), 10 in 0.02 s (0.5 GB/s).
        let (peak, avg, rate) = bw_stats(1_000_000, 1, &[(10, 0.01), (10, 0.02)]);
        assert!((peak - 1.0).abs() < 1e-12);
        assert!((avg - 20e6 / 0.03 / 1e9).abs() < 1e-12);
        assert!((rate - 20.0 / 0.03 / 1e6).abs() < 1e-12);
        let (p2, a2, r2) = bw_stats(1_000_000, 2, &[(10, 0.01)]);
        assert!((p2 - 2.0).abs() < 1e-12 && (a2 - 2.0).abs() < 1e-12 && (r2 - 0.002).abs() < 1e-12);
        assert_eq!(bw_stats(8, 1, &[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn columns_are_perftests() {
        let c = bw_columns();
        let words: Vec<&str> = c
            .split("  ")
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .collect();
        assert_eq!(
            words,
            [
                "#bytes",
                "#iterations",
                "BW peak[GB/sec]",
                "BW average[GB/sec]",
                "MsgRate[Mpps]"
            ]
        );
        let l = lat_columns();
        for w in [
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99% percentile[usec]",
            "99.9% percentile[usec]",
        ] {
            assert!(l.contains(w), "{w} missing from {l}");
        }
        assert_eq!(
            bw_row(65536, 1000, 1.5, 1.25, 0.019)
                .split_whitespace()
                .count(),
            5
        );
    }
}
