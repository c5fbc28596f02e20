//! Point-to-point benchmark on exactly two ranks.
//!
//! Per size:
//! - latency: ping-pong (rank 0 sends, rank 1 echoes), half the mean round
//!   trip as rank 0 measures it;
//! - one-way bandwidth: rank 0 posts `-n` sends, [`WINDOW`] at a time (as
//!   osu_bw does), rank 1 the matching receives, then rank 1 acknowledges
//!   with one byte; rank 0's time from the start to the acknowledgement;
//! - bidirectional bandwidth: both ranks post `-n` sendrecv calls, a window
//!   at a time; bytes moved in both directions over the slower rank's time;
//! - with `-c 1`, one more exchange of a known pattern, checked byte by byte.
//!
//! With `-T` each of the three loops is sized by time instead of `-n`, as
//! the collectives' are (`bench/peers/mpi_p2p.c` measures MPI the same way).
//!
//! With `--device cuda` the messages leave from and land in device memory
//! through the communicator's device path (`DeviceComm::sendrecv`, which
//! `gwSend`/`gwRecv` take): blocking calls staged through pinned host
//! buffers, so the bandwidth loops send one message at a time, without
//! windows, and the rows include both copies across the bus.
//!
//! Only point-to-point calls are used, so it runs without any collective
//! algorithm.

use crate::Fail;
use crate::args::{Device, P2pOpts};
use crate::on_device::OnDevice;
use crate::pages::Buffer;
use crate::report::{self, Header, P2pRow, RankLine, Summary};
use gw_collectives::{Communicator, DType, Error, Handle};
use std::io::Write as _;
use std::time::Instant;

/// The byte rank `src` sends at index `i`; never 0xff.
pub fn pattern(src: u32, size: usize, i: usize) -> u8 {
    ((src as usize * 131 + i * 7 + size) % 251) as u8
}

/// Transfers in flight at once in the bandwidth loops (osu_bw's window).
/// Point-to-point messages all run at once, so without a window `-n` large
/// messages would all be in flight together.
pub const WINDOW: usize = 64;

/// Why a transfer failed: the library, or the device path of `--device
/// cuda` (a driver call, the staging), whose errors are messages.
pub(crate) enum XferError {
    Lib(Error),
    Device(String),
}

impl From<Error> for XferError {
    fn from(e: Error) -> XferError {
        XferError::Lib(e)
    }
}

impl XferError {
    /// As gwbench reports it: `what` (the transfer that failed) and why.
    pub(crate) fn fail(self, what: String) -> Fail {
        match self {
            XferError::Lib(err) => Fail::Lib { what, err },
            XferError::Device(m) => Fail::Other(format!("{what}: --device cuda: {m}")),
        }
    }
}

/// Posts `k` transfers (each a send of `send`, a receive into `recv`, or
/// both), [`WINDOW`] at a time, and waits for all of them.
fn post(
    comm: &Communicator,
    peer: u32,
    k: usize,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
) -> Result<(), Error> {
    let s = send.map(|b| (peer, b.as_ptr(), b.len()));
    let r = recv.map(|b| (peer, b.as_mut_ptr(), b.len()));
    let mut handles: Vec<Handle> = Vec::with_capacity(k.min(WINDOW));
    let mut first = None;
    let mut left = k;
    while left > 0 && first.is_none() {
        let w = left.min(WINDOW);
        for _ in 0..w {
            // SAFETY: the slices are borrowed for this whole function, and
            // every submitted handle is waited for before it returns.
            match unsafe { comm.sendrecv_raw(DType::U8, s, r) } {
                Ok(h) => handles.push(h),
                Err(e) => {
                    first = Some(e);
                    break;
                }
            }
        }
        for h in handles.drain(..) {
            if let Err(e) = h.wait() {
                first.get_or_insert(e);
            }
        }
        left -= w;
    }
    first.map_or(Ok(()), Err)
}

/// The three timed loops of a size's row.
#[derive(Clone, Copy)]
enum Loop {
    PingPong,
    Stream,
    BothWays,
}

impl Loop {
    fn name(self) -> &'static str {
        match self {
            Loop::PingPong => "ping-pong",
            Loop::Stream => "one-way stream",
            Loop::BothWays => "bidirectional exchange",
        }
    }
}

pub(crate) struct P2p<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) me: u32,
    pub(crate) peer: u32,
    pub(crate) send: Buffer<u8>,
    pub(crate) recv: Buffer<u8>,
    tiny: [u8; 1],
    /// `--device cuda`: where the messages leave from and land.
    dev: Option<OnDevice<'a>>,
}

impl P2p<'_> {
    /// One blocking transfer of `size` bytes with the peer: a send, a
    /// receive, or both at once; from and into device memory with
    /// `--device cuda`, else the host buffers.
    fn transfer(&mut self, size: usize, send: bool, recv: bool) -> Result<(), XferError> {
        let p = self.peer;
        if let Some(d) = &self.dev {
            let s = send.then(|| (p, d.send.ptr() as *const u8, size));
            let r = recv.then(|| (p, d.recv.ptr() as *mut u8, size));
            // SAFETY: both device buffers hold the largest size and are
            // reached by nothing else during the blocking call.
            return unsafe { d.dc.sendrecv(s, r) }.map_err(XferError::Device);
        }
        let (c, sb, rb) = (self.comm, &self.send[..size], &mut self.recv[..size]);
        Ok(match (send, recv) {
            (true, true) => c.sendrecv(sb, p, rb, p),
            (true, false) => c.send(p, sb),
            (false, true) => c.recv(p, rb),
            (false, false) => Ok(()),
        }?)
    }

    /// `k` transfers of `size` bytes (sends, receives, or both at once): in
    /// windows ([`post`]) from host memory, one blocking call at a time
    /// from device memory, whose messages have no non-blocking form.
    fn burst(&mut self, size: usize, k: usize, send: bool, recv: bool) -> Result<(), XferError> {
        if self.dev.is_some() {
            for _ in 0..k {
                self.transfer(size, send, recv)?;
            }
            return Ok(());
        }
        let s = send.then_some(&self.send[..size]);
        let r = recv.then_some(&mut self.recv[..size]);
        Ok(post(self.comm, self.peer, k, s, r)?)
    }

    /// One round trip of `size` bytes (rank 0 first).
    pub(crate) fn round(&mut self, size: usize) -> Result<(), XferError> {
        let first = self.me == 0;
        self.transfer(size, first, !first)?;
        self.transfer(size, !first, first)
    }

    /// A one-byte round trip, so that both ranks start the next phase together.
    /// Rank 0 posts its receive together with its send, so that it is posted
    /// before rank 1 can answer (and, after the last one, exit).
    fn sync(&mut self) -> Result<(), XferError> {
        let (c, p) = (self.comm, self.peer);
        let one = [1u8];
        if self.me == 0 {
            c.sendrecv(&one, p, &mut self.tiny, p)?;
        } else {
            c.recv(p, &mut self.tiny)?;
            c.send(p, &one)?;
        }
        Ok(())
    }

    /// Seconds this rank spent on `k` iterations of `lp`.
    fn timed(&mut self, lp: Loop, size: usize, k: usize) -> Result<f64, XferError> {
        match lp {
            Loop::PingPong => self.pingpong(size, k),
            Loop::Stream => self.stream(size, k),
            Loop::BothWays => self.both_ways(size, k),
        }
    }

    /// Seconds this rank spent on `k` round trips.
    fn pingpong(&mut self, size: usize, k: usize) -> Result<f64, XferError> {
        let t0 = Instant::now();
        for _ in 0..k {
            self.round(size)?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    /// The larger of the two ranks' `mine`.
    fn slower(&mut self, mine: f64) -> Result<f64, XferError> {
        let mut theirs = [0.0f64];
        self.comm
            .sendrecv(&[mine], self.peer, &mut theirs, self.peer)?;
        Ok(mine.max(theirs[0]))
    }

    /// `-T`: the count whose `lp` loop lasts about `target` seconds on the
    /// slower rank (see [`crate::nccl::count_for_time`]); never fewer than
    /// `least`.
    fn count_for(
        &mut self,
        target: f64,
        least: usize,
        size: usize,
        lp: Loop,
    ) -> Result<usize, XferError> {
        crate::nccl::count_for_time(target, least, |k| {
            let mine = self.timed(lp, size, k)?;
            self.slower(mine)
        })
    }

    /// Seconds for `k` one-way messages plus the acknowledgement (rank 0).
    pub(crate) fn stream(&mut self, size: usize, k: usize) -> Result<f64, XferError> {
        self.sync()?;
        let (c, p) = (self.comm, self.peer);
        let t0 = Instant::now();
        let sender = self.me == 0;
        self.burst(size, k, sender, !sender)?;
        if sender {
            c.recv(p, &mut self.tiny)?;
        } else {
            c.send(p, &[1u8])?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Seconds for `k` simultaneous exchanges, the larger of the two ranks'.
    pub(crate) fn both_ways(&mut self, size: usize, k: usize) -> Result<f64, XferError> {
        self.sync()?;
        let t0 = Instant::now();
        self.burst(size, k, true, true)?;
        let mine = t0.elapsed().as_secs_f64();
        self.slower(mine)
    }

    /// Writes this rank's pattern for `size` into the send buffer (and its
    /// device copy).
    fn fill(&mut self, size: usize) -> Result<(), XferError> {
        for (i, b) in self.send[..size].iter_mut().enumerate() {
            *b = pattern(self.me, size, i);
        }
        if let Some(d) = &self.dev {
            d.send
                .upload(&self.send[..size])
                .map_err(|e| XferError::Device(format!("filling the device buffer: {e}")))?;
        }
        Ok(())
    }

    /// Exchanges the pattern once; wrong bytes on (this rank, both ranks).
    fn check(&mut self, size: usize) -> Result<(u64, u64), XferError> {
        self.fill(size)?;
        self.recv[..size].fill(0xff);
        if let Some(d) = &self.dev {
            d.recv
                .upload(&self.recv[..size])
                .map_err(|e| XferError::Device(format!("poisoning the device buffer: {e}")))?;
        }
        self.transfer(size, true, true)?;
        if let Some(d) = &self.dev {
            d.recv
                .download(&mut self.recv[..size])
                .map_err(|e| XferError::Device(format!("reading the device buffer back: {e}")))?;
        }
        let wrong = (0..size)
            .filter(|&i| self.recv[i] != pattern(self.peer, size, i))
            .count() as i64;
        let mut theirs = [0i64];
        self.comm
            .sendrecv(&[wrong], self.peer, &mut theirs, self.peer)?;
        Ok((wrong as u64, (wrong + theirs[0]) as u64))
    }
}

/// Runs the benchmark; `Ok(false)` when some byte arrived wrong.
pub fn run(comm: &Communicator, o: &P2pOpts) -> Result<bool, Fail> {
    let n = comm.size();
    if n != 2 {
        return Err(Fail::Usage(format!(
            "p2p needs exactly 2 ranks, this job has {n} (run: gwrun -n 2 gwbench p2p)"
        )));
    }
    let me = comm.rank();
    let json = crate::nccl::create_json(o.json.as_deref(), me)?;
    let sizes = o.sizes.seq();
    let max = sizes.last().copied().unwrap_or(0);
    let mut b = P2p {
        comm,
        me,
        peer: 1 - me,
        send: crate::nccl::alloc::<u8>(max, "send", o.hugepages)?,
        recv: crate::nccl::alloc::<u8>(max, "receive", o.hugepages)?,
        tiny: [0],
        dev: match o.device {
            Device::Host => None,
            Device::Cuda => Some(OnDevice::new(comm, max.max(1), max.max(1))?),
        },
    };
    let routes = comm.routes();
    let header = Header {
        collective: "p2p".into(),
        world: n,
        transport: comm.transport_summary(),
        algorithm: None,
        datatype: None,
        redop: None,
        root: -1,
        min_bytes: o.sizes.min,
        max_bytes: o.sizes.max,
        step_factor: o.sizes.factor,
        iters: o.iters,
        time_s: o.time,
        warmup: o.warmup,
        check: o.check,
        hugepages: o
            .hugepages
            .then(|| crate::pages::Given::of(&[b.send.span(), b.recv.span()])),
        ranks: comm
            .hostnames()
            .iter()
            .enumerate()
            .map(|(r, h)| RankLine {
                rank: r as u32,
                host: h.clone(),
                route: routes.get(r).copied().unwrap_or("?").into(),
            })
            .collect(),
    };
    let print = |line: &str| {
        if me == 0 {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    };
    for l in report::header_lines(&header) {
        print(&l);
    }
    if let Some(d) = &b.dev {
        print(&d.line());
    }
    if let Some(pt) = &o.perftest {
        for (i, x) in b.send.iter_mut().enumerate() {
            *x = pattern(me, max, i);
        }
        crate::perftest::run(&mut b, o, pt, &print)?;
        b.sync()
            .map_err(|e| e.fail("final synchronisation".into()))?;
        return Ok(true);
    }
    for l in report::p2p_columns() {
        print(&l);
    }

    let lib = |what: &str, size: usize| {
        let what = format!("p2p {what} of {size} bytes");
        move |e: XferError| e.fail(what)
    };
    let mut rows = Vec::new();
    let mut out_of_bounds = 0u64;
    for &size in &sizes {
        b.fill(size).map_err(lib("filling the buffers", size))?;
        // Each loop: its warm-up, its count (-n, or sized by -T), its timing.
        let mut secs = [0.0f64; 3];
        let mut counts = [o.iters; 3];
        for (l, lp) in [Loop::PingPong, Loop::Stream, Loop::BothWays]
            .into_iter()
            .enumerate()
        {
            let what = lp.name();
            if o.warmup > 0 {
                b.timed(lp, size, o.warmup)
                    .map_err(lib(&format!("{what} warm-up"), size))?;
            }
            if let Some(t) = o.time {
                counts[l] = b
                    .count_for(t, o.iters, size, lp)
                    .map_err(lib(&format!("{what} loop sizing"), size))?;
            }
            secs[l] = b.timed(lp, size, counts[l]).map_err(lib(what, size))?;
        }
        // Rank 0's round trips, as ping-pong latency is reported.
        let lat = secs[0] / counts[0] as f64 / 2.0;
        let (one, two) = (secs[1], secs[2]);
        let wrong = if o.check {
            let (mine, total) = b.check(size).map_err(lib("checked exchange", size))?;
            // Each rank's failed check counts once, as in the collective table.
            let mut theirs = [0i64];
            comm.sendrecv(&[i64::from(mine > 0)], b.peer, &mut theirs, b.peer)
                .map_err(XferError::from)
                .map_err(lib("exchange of check results", size))?;
            out_of_bounds += u64::from(mine > 0) + theirs[0] as u64;
            Some(total)
        } else {
            None
        };
        let row = P2pRow {
            size,
            latency_us: lat * 1e6,
            bw: (size * counts[1]) as f64 / one / 1e9,
            bibw: 2.0 * (size * counts[2]) as f64 / two / 1e9,
            wrong,
        };
        print(&report::p2p_row_line(&row));
        rows.push(row);
    }
    let summary = Summary {
        out_of_bounds,
        avg_busbw: None,
    };
    for l in report::footer_lines(&summary) {
        print(&l);
    }
    if let Some(out) = json {
        out.write(&report::json(&header, &rows, &summary))?;
    }
    // Rank 0's last lines are out before either rank exits.
    b.sync()
        .map_err(|e| e.fail("final synchronisation".into()))?;
    Ok(out_of_bounds == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_never_matches_the_poison_and_tells_ranks_apart() {
        for size in [1, 7, 4096] {
            for i in 0..size {
                assert_ne!(pattern(0, size, i), 0xff);
                assert_ne!(pattern(1, size, i), 0xff);
                assert_ne!(pattern(0, size, i), pattern(1, size, i));
            }
        }
    }
}
