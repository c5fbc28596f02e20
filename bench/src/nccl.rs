//! The collective benchmark, as nccl-tests runs it.
//!
//! For every size, out-of-place then in-place: fill the inputs, run `-w`
//! untimed iterations, barrier, then submit `-n` iterations back to back (the
//! engine runs them in order, as a CUDA stream would) and wait for the last;
//! the time is the mean per call, and the row shows the largest mean over
//! ranks. With `-c 1` the buffers are then filled again (outputs poisoned) and
//! one more call is checked element by element, outside the timed region.

use crate::Fail;
use crate::args::{Coll, CollOpts, Device};
use crate::check::{Pattern, Value, count_wrong, poison};
use crate::on_device::OnDevice;
use crate::pages::Buffer;
use crate::report::{self, Header, Meas, RankLine, Row, Summary};
use gradwire::device::DeviceRequest;
use gw_collectives::{
    Algo, Communicator, DType, Error, OpKind, RawOp, RawPersistent, RawSharedAllReduce, RedOp,
    Registration,
};
use gw_cuda::DeviceBuf;
use half::{bf16, f16};
use std::io::Write as _;
use std::time::Instant;

/// The most iterations `-T` sizes a loop to (a call under 10 ns would need
/// more for a second; none is that fast).
const MAX_TIMED_ITERS: usize = 1 << 27;

/// `-T`: the count whose loop lasts about `target` seconds, from timing 1,
/// 2, 4, ... iterations until a batch lasts a tenth of it; never fewer
/// than `least`. `time(k)` runs k iterations and returns the slowest
/// rank's seconds, the same on every rank, so all derive the same count.
/// The collectives' loops and p2p's use it alike.
pub(crate) fn count_for_time<E>(
    target: f64,
    least: usize,
    mut time: impl FnMut(usize) -> Result<f64, E>,
) -> Result<usize, E> {
    let mut k = 1usize;
    loop {
        let t = time(k)?;
        if t >= target / 10.0 || k >= MAX_TIMED_ITERS {
            let n = (k as f64 * target / t.max(1e-9)).ceil();
            return Ok((n as usize).clamp(least, MAX_TIMED_ITERS.max(least)));
        }
        k *= 2;
    }
}

/// Buffer sizes of one row, in elements (nccl-tests' `getCollByteCount`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The count column, and the count given to the library.
    pub count: usize,
    /// Out-of-place send buffer.
    pub send: usize,
    /// Out-of-place receive buffer.
    pub recv: usize,
    /// The size column: max(send, recv) bytes.
    pub bytes: usize,
}

impl Layout {
    /// The in-place buffer, in elements.
    pub fn in_place(&self) -> usize {
        self.send.max(self.recv)
    }
}

/// The buffers of the row for `size` bytes of `esz`-byte elements on `n` ranks:
/// all-reduce, broadcast and reduce move `size / esz` elements; reduce-scatter
/// and all-gather split them into `n` chunks rounded down to whole 16 bytes
/// (`(count / n) & -(16 / esz)`, as nccl-tests does), so their size column is
/// the send (reduce-scatter) or receive (all-gather) buffer: chunk · n.
pub fn layout(coll: Coll, size: usize, esz: usize, n: usize) -> Layout {
    let count = size / esz;
    match coll {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce => Layout {
            count,
            send: count,
            recv: count,
            bytes: count * esz,
        },
        Coll::ReduceScatter | Coll::AllGather => {
            let align = (16 / esz).max(1);
            let chunk = count / n / align * align;
            let whole = chunk * n;
            let (send, recv) = if coll == Coll::ReduceScatter {
                (whole, chunk)
            } else {
                (chunk, whole)
            };
            Layout {
                count: chunk,
                send,
                recv,
                bytes: whole * esz,
            }
        }
    }
}

/// The header's algorithm line.
pub fn algorithm_text(
    coll: Coll,
    forced: Option<Algo>,
    env_algo: Option<Algo>,
    auto: &str,
) -> String {
    match (coll, forced, env_algo) {
        (Coll::AllReduce, Some(a), _) => a.name().to_string(),
        (Coll::AllReduce, None, Some(a)) => format!("auto: {} (GW_ALGO)", a.name()),
        (Coll::AllReduce, None, None) => auto.to_string(),
        (Coll::ReduceScatter | Coll::AllGather, _, _) => "ring".into(),
        (Coll::Broadcast | Coll::Reduce, _, _) => {
            "pipelined chain, or binary tree for few segments".into()
        }
    }
}

/// Runs the benchmark; `Ok(false)` when some result was wrong.
pub fn run(comm: &Communicator, o: &CollOpts) -> Result<bool, Fail> {
    if o.coll.rooted() && o.root >= comm.size() {
        return Err(Fail::Usage(format!(
            "-r {} is not a rank of this {}-rank job",
            o.root,
            comm.size()
        )));
    }
    match o.dtype {
        DType::F32 => Bench::<f32>::new(comm, o)?.run(),
        DType::F64 => Bench::<f64>::new(comm, o)?.run(),
        DType::F16 => Bench::<f16>::new(comm, o)?.run(),
        DType::Bf16 => Bench::<bf16>::new(comm, o)?.run(),
        DType::I32 => Bench::<i32>::new(comm, o)?.run(),
        DType::I64 => Bench::<i64>::new(comm, o)?.run(),
        DType::U8 => Bench::<u8>::new(comm, o)?.run(),
        DType::Bytes => Err(Fail::Usage("datatype bytes cannot be benchmarked".into())),
    }
}

/// Creates the `-J` file on rank 0 up front, so that a bad path fails before
/// the run rather than after it.
pub fn create_json(path: Option<&std::path::Path>, rank: u32) -> Result<Option<JsonOut>, Fail> {
    match path {
        Some(p) if rank == 0 => match std::fs::File::create(p) {
            Ok(f) => Ok(Some(JsonOut {
                file: f,
                path: p.to_path_buf(),
            })),
            Err(e) => Err(Fail::Other(format!("cannot create {}: {e}", p.display()))),
        },
        _ => Ok(None),
    }
}

/// The open `-J` file.
pub struct JsonOut {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl JsonOut {
    /// Writes `doc` (a [`report::json`] document), indented, with a final newline.
    pub fn write(self, doc: &impl serde::Serialize) -> Result<(), Fail> {
        let cannot = |e: &dyn std::fmt::Display| {
            Fail::Other(format!("cannot write {}: {e}", self.path.display()))
        };
        let mut out = std::io::BufWriter::new(&self.file);
        serde_json::to_writer_pretty(&mut out, doc).map_err(|e| cannot(&e))?;
        out.write_all(b"\n")
            .and_then(|()| out.flush())
            .map_err(|e| cannot(&e))
    }
}

/// Zero-filled memory for `n` elements, faulted in, or an error instead of
/// an abort; with `huge`, on transparent huge pages (see [`crate::pages`]).
pub fn alloc<T: Value>(n: usize, what: &str, huge: bool) -> Result<Buffer<T>, Fail> {
    Buffer::zeroed(n, huge).map_err(|e| {
        let pages = if huge { " on huge pages" } else { "" };
        Fail::Other(format!("cannot allocate the {what} buffer{pages}: {e}"))
    })
}

/// Runs `k` copies of `op`, each a blocking call, as a training loop and
/// MPI's own benchmarks call all-reduce (the calling thread turns the
/// engine; see the communicator's `run_raw`).
///
/// # Safety
/// The buffers `op` points at must be valid for its layout and untouched by
/// the caller until this returns.
pub unsafe fn launch(
    comm: &Communicator,
    op: RawOp,
    algo: Option<Algo>,
    k: usize,
) -> Result<(), Error> {
    for _ in 0..k {
        // SAFETY: forwarded from the caller.
        unsafe { comm.run_raw(op, algo) }?;
    }
    Ok(())
}

/// `v` as bytes.
fn bytes_of<T: Value>(v: &[T]) -> &[u8] {
    // SAFETY: Value types are plain numbers without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Value>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as bytes_of; every bit pattern is some value of these types.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

struct Bench<'a, T: Value> {
    comm: &'a Communicator,
    o: &'a CollOpts,
    me: u32,
    n: u32,
    pattern: Pattern,
    send: Buffer<T>,
    recv: Buffer<T>,
    sizes: Vec<(usize, Layout)>,
    /// With `-P 1`: the persistent all-reduce of the size being measured.
    persistent: Option<RawPersistent>,
    /// With `-P 1 --shared 1`: the request on its own shared buffers.
    shared: Option<RawSharedAllReduce>,
    /// With `-P 1`: whether the last one ran on the host region's rounds.
    persistent_on_host: bool,
    dev: Option<OnDevice<'a>>,
    /// With `-P 1 --device cuda`: the persistent device all-reduce.
    dev_persistent: Option<DeviceRequest>,
    /// With `--register 1`: the send and receive buffers' registrations.
    regs: Vec<Registration>,
}

impl<T: Value> Drop for Bench<'_, T> {
    fn drop(&mut self) {
        // Before the buffers go: a registration must not outlive its memory.
        for r in std::mem::take(&mut self.regs) {
            if let Err(e) = self.comm.deregister(&r) {
                eprintln!("gwbench: deregistering {} bytes: {e}", r.len());
            }
        }
    }
}

impl<'a, T: Value> Bench<'a, T> {
    fn new(comm: &'a Communicator, o: &'a CollOpts) -> Result<Self, Fail> {
        let n = comm.size();
        let esz = size_of::<T>();
        let sizes: Vec<(usize, Layout)> = o
            .sizes
            .seq()
            .into_iter()
            .map(|s| (s, layout(o.coll, s, esz, n as usize)))
            .collect();
        let max_send = sizes.iter().map(|(_, l)| l.send).max().unwrap_or(0);
        let max_buf = sizes.iter().map(|(_, l)| l.in_place()).max().unwrap_or(0);
        let dev = match o.device {
            Device::Host => None,
            Device::Cuda => Some(OnDevice::new(comm, max_send * esz, max_buf * esz)?),
        };
        let mut b = Bench {
            comm,
            o,
            me: comm.rank(),
            n,
            pattern: Pattern::new(o.dtype, o.redop, n),
            send: alloc(max_send, "send", o.hugepages)?,
            recv: alloc(max_buf, "receive", o.hugepages)?,
            sizes,
            persistent: None,
            shared: None,
            persistent_on_host: false,
            dev,
            dev_persistent: None,
            regs: Vec::new(),
        };
        if o.register {
            for buf in [bytes_of_mut(&mut b.send), bytes_of_mut(&mut b.recv)] {
                if buf.is_empty() {
                    continue;
                }
                // SAFETY: the buffers live, unresized, until Drop, which
                // deregisters them first.
                let r = unsafe { comm.register_raw(buf.as_mut_ptr(), buf.len()) }
                    .map_err(|e| Fail::lib("registering the buffers (--register 1)", e))?;
                b.regs.push(r);
            }
        }
        Ok(b)
    }

    fn header(&self) -> Header {
        let cfg = self.comm.config();
        let routes = self.comm.routes();
        Header {
            collective: self.o.coll.name().into(),
            world: self.n,
            transport: self.comm.transport_summary(),
            algorithm: Some(algorithm_text(
                self.o.coll,
                self.o.algo,
                cfg.algo.value,
                &self.comm.describe_auto_algo(),
            )),
            datatype: Some(self.o.dtype.name()),
            redop: Some(self.o.redop.name()),
            root: self.root_column(),
            min_bytes: self.o.sizes.min,
            max_bytes: self.o.sizes.max,
            step_factor: self.o.sizes.factor,
            iters: self.o.iters,
            time_s: self.o.time,
            warmup: self.o.warmup,
            check: self.o.check,
            hugepages: self
                .o
                .hugepages
                .then(|| crate::pages::Given::of(&[self.send.span(), self.recv.span()])),
            ranks: self
                .comm
                .hostnames()
                .iter()
                .enumerate()
                .map(|(r, h)| RankLine {
                    rank: r as u32,
                    host: h.clone(),
                    route: routes.get(r).copied().unwrap_or("?").into(),
                })
                .collect(),
        }
    }

    fn root_column(&self) -> i64 {
        if self.o.coll.rooted() {
            i64::from(self.o.root)
        } else {
            -1
        }
    }

    fn print(&self, line: &str) {
        if self.me == 0 {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }

    fn run(mut self) -> Result<bool, Fail> {
        let json = create_json(self.o.json.as_deref(), self.me)?;
        let header = self.header();
        for l in report::header_lines(&header) {
            self.print(&l);
        }
        if let Some(d) = &self.dev {
            self.print(&d.line());
        }
        for l in report::COLUMNS {
            self.print(l);
        }
        let factor = self.o.coll.busbw_factor(self.n);
        let mut rows = Vec::new();
        let mut out_of_bounds = 0u64;
        let sizes = std::mem::take(&mut self.sizes);
        for &(size, l) in &sizes {
            let mut meas = [None, None];
            for (slot, in_place) in meas.iter_mut().zip([false, true]) {
                let (secs, wrong) = self.measure(size, &l, in_place)?;
                if let Some((_, failed)) = wrong {
                    out_of_bounds += failed;
                }
                *slot = Some(Meas::new(l.bytes, secs, factor, wrong.map(|w| w.0)));
            }
            let [Some(out_of_place), Some(in_place)] = meas else {
                unreachable!("both placements measured")
            };
            let bytes = l.count * size_of::<T>();
            // A call a host region takes (small calls', or persistent
            // rounds') has no engine algorithm, and the cost model has no
            // term for it. Device buffers never go there.
            let on_region = if self.dev.is_some() || self.o.algo.is_some() {
                false
            } else if self.o.persistent {
                self.persistent_on_host
            } else {
                self.comm
                    .takes_host_region(OpKind::AllReduce, l.count, self.o.dtype)
            };
            let chosen = (self.o.coll == Coll::AllReduce && !on_region)
                .then(|| self.o.algo.unwrap_or_else(|| self.comm.choose_algo(bytes)));
            let algo = match chosen {
                Some(a) => Some(a.name()),
                None if self.o.coll == Coll::AllReduce => Some("host"),
                None => None,
            };
            let predicted_us = chosen.map(|a| self.comm.predict_all_reduce(a, bytes) * 1e6);
            let row = Row {
                size: l.bytes,
                count: l.count,
                dtype: self.o.dtype.name(),
                redop: self.o.redop.name(),
                root: self.root_column(),
                algo,
                predicted_us,
                out_of_place,
                in_place,
            };
            self.print(&report::row_line(&row));
            rows.push(row);
        }
        let avg = if rows.is_empty() {
            0.0
        } else {
            rows.iter()
                .map(|r| r.out_of_place.busbw + r.in_place.busbw)
                .sum::<f64>()
                / (2 * rows.len()) as f64
        };
        let summary = Summary {
            out_of_bounds,
            avg_busbw: Some(avg),
        };
        for l in report::footer_lines(&summary) {
            self.print(&l);
        }
        for l in report::prediction_lines(&rows) {
            self.print(&l);
        }
        if let Some(out) = json {
            out.write(&report::json(&header, &rows, &summary))?;
        }
        // Rank 0's last lines are out before any rank exits (and the launcher,
        // on a failing status, stops the rest).
        self.comm
            .barrier()
            .map_err(|e| Fail::lib("final barrier", e))?;
        Ok(out_of_bounds == 0)
    }

    /// Fills the inputs of one call with the pattern and poisons the outputs
    /// (on the device too, with `--device cuda`).
    fn prepare(&mut self, l: &Layout, in_place: bool) -> Result<(), Fail> {
        self.prepare_host(l, in_place);
        if let Some(s) = &self.shared {
            let from = if in_place { &self.recv } else { &self.send };
            // SAFETY: the request's buffers hold `l.count` elements of `T`
            // (made for this layout), and no round runs between calls.
            unsafe {
                let to = std::slice::from_raw_parts_mut(s.send_ptr().cast::<T>(), l.count);
                to.copy_from_slice(&from[..l.count]);
                if !in_place {
                    poison(std::slice::from_raw_parts_mut(
                        s.recv_ptr().cast::<T>(),
                        l.count,
                    ));
                }
            }
        }
        let Some(d) = &self.dev else { return Ok(()) };
        let up = |buf: &DeviceBuf, v: &[T]| {
            buf.upload(bytes_of(v))
                .map_err(|e| Fail::Other(format!("--device cuda: filling the buffers: {e}")))
        };
        if in_place {
            up(&d.recv, &self.recv[..l.in_place()])
        } else {
            up(&d.send, &self.send[..l.send])?;
            up(&d.recv, &self.recv[..l.recv])
        }
    }

    /// Copies this rank's result back from the device for `-c 1`.
    fn fetch(&mut self, l: &Layout, in_place: bool) -> Result<(), Fail> {
        if let Some(s) = &self.shared {
            // SAFETY: as in `prepare`.
            let from = unsafe { std::slice::from_raw_parts(s.recv_ptr().cast::<T>(), l.count) };
            self.recv[..l.count].copy_from_slice(from);
        }
        let Some(d) = &self.dev else { return Ok(()) };
        let n = if in_place { l.in_place() } else { l.recv };
        d.recv
            .download(bytes_of_mut(&mut self.recv[..n]))
            .map_err(|e| Fail::Other(format!("--device cuda: reading the result: {e}")))
    }

    fn prepare_host(&mut self, l: &Layout, in_place: bool) {
        let (me, p) = (self.me, self.pattern);
        if !in_place {
            for (j, x) in self.send[..l.send].iter_mut().enumerate() {
                *x = p.input(me, j);
            }
            poison(&mut self.recv[..l.recv]);
            return;
        }
        let buf = &mut self.recv[..l.in_place()];
        if self.o.coll == Coll::AllGather {
            poison(buf);
            let c = l.count;
            for (i, x) in buf[me as usize * c..][..c].iter_mut().enumerate() {
                *x = p.input(me, i);
            }
        } else {
            for (j, x) in buf[..l.send].iter_mut().enumerate() {
                *x = p.input(me, j);
            }
        }
    }

    /// The call, with in-place offsets as NCCL defines them.
    fn op(&mut self, l: &Layout, in_place: bool) -> RawOp {
        let c = l.count;
        let mine = self.me as usize * c;
        // Device addresses are not Rust allocations: wrapping arithmetic.
        let (send0, recv): (*const T, *mut T) = match &self.dev {
            Some(d) => (d.send.ptr() as *const T, d.recv.ptr() as *mut T),
            None => (self.send.as_ptr(), self.recv.as_mut_ptr()),
        };
        // mine + c <= n · c = l.in_place() <= the receive buffer for the
        // collectives that offset.
        let (send, recv): (*const T, *mut T) = if !in_place {
            (send0, recv)
        } else {
            match self.o.coll {
                Coll::ReduceScatter => (recv, recv.wrapping_add(mine)),
                Coll::AllGather => (recv.wrapping_add(mine), recv),
                _ => (recv, recv),
            }
        };
        RawOp {
            kind: self.o.coll.kind(),
            dtype: T::DTYPE,
            redop: self.o.redop,
            count: c,
            root: self.o.root,
            send: send.cast(),
            recv: recv.cast(),
            weight: None,
        }
    }

    fn call(
        &mut self,
        l: &Layout,
        in_place: bool,
        k: usize,
        what: &str,
        size: usize,
    ) -> Result<(), Fail> {
        if k == 0 {
            return Ok(());
        }
        let fail = |e| Fail::Lib {
            what: format!(
                "{} of {size} bytes ({}, {what})",
                self.o.coll.name(),
                if in_place { "in-place" } else { "out-of-place" }
            ),
            err: e,
        };
        let op = self.op(l, in_place);
        if let Some(d) = &self.dev {
            let dfail = |e: String| {
                Fail::Other(format!(
                    "{} of {size} bytes ({}, {what}) on the device: {e}",
                    self.o.coll.name(),
                    if in_place { "in-place" } else { "out-of-place" }
                ))
            };
            if let Some(p) = &self.dev_persistent {
                for _ in 0..k {
                    p.start(&d.dc).map_err(dfail)?;
                    p.wait().map_err(dfail)?;
                }
                return Ok(());
            }
            for _ in 0..k {
                // SAFETY: `op` points into the device buffers, sized for
                // every row, untouched until each call returns.
                unsafe { d.dc.run(&op) }.map_err(dfail)?;
            }
            return Ok(());
        }
        if let Some(p) = &mut self.shared {
            for _ in 0..k {
                // SAFETY: the request's own buffers, which nothing touches
                // until `wait` returns.
                unsafe { p.start(self.comm) }.map_err(fail)?;
                p.wait(self.comm).map_err(fail)?;
            }
            return Ok(());
        }
        if let Some(p) = &self.persistent {
            for _ in 0..k {
                // SAFETY: the request points into self.send / self.recv,
                // which nothing touches until `wait` returns.
                unsafe { p.start(self.comm) }.map_err(fail)?;
                p.wait(self.comm).map_err(fail)?;
            }
            return Ok(());
        }
        // SAFETY: `op` points into self.send / self.recv, sized for every row
        // at construction; nothing touches them until `launch` has waited for
        // every call.
        unsafe { launch(self.comm, op, self.o.algo, k) }.map_err(fail)
    }

    /// Times one placement of one size; with `-c 1` also checks it and returns
    /// (wrong elements over ranks, ranks that saw any).
    #[allow(clippy::type_complexity)]
    fn measure(
        &mut self,
        size: usize,
        l: &Layout,
        in_place: bool,
    ) -> Result<(f64, Option<(u64, u64)>), Fail> {
        if self.o.persistent && self.o.shared {
            let s = self
                .comm
                .shared_all_reduce_init_raw(T::DTYPE, l.count, self.o.redop, in_place)
                .map_err(|e| Fail::lib("shared all-reduce init", e))?;
            self.shared = Some(s);
        }
        self.prepare(l, in_place)?;
        if self.o.persistent && self.shared.is_none() {
            let op = self.op(l, in_place);
            if let Some(d) = &self.dev {
                // SAFETY: `op` points into the device buffers, which live as
                // long as the bench; the request is dropped (after its last
                // round) at the end of this measurement.
                let p = unsafe { d.dc.all_reduce_init(&op) }
                    .map_err(|e| Fail::Other(format!("persistent device all-reduce init: {e}")))?;
                self.dev_persistent = Some(p);
            } else {
                // SAFETY: `op` points into self.send / self.recv, which live
                // as long as the bench and are not resized; the request is
                // freed at the end of this measurement.
                let p = unsafe { self.comm.prepare_raw(op, self.o.algo) }
                    .map_err(|e| Fail::lib("persistent all-reduce init", e))?;
                self.persistent = Some(p);
            }
        }
        let r = self.measure_prepared(size, l, in_place);
        self.dev_persistent = None;
        if let Some(s) = self.shared.take() {
            self.persistent_on_host = s.on_host();
            s.free(self.comm)
                .map_err(|e| Fail::lib("freeing the shared all-reduce", e))?;
        }
        if let Some(p) = self.persistent.take() {
            self.persistent_on_host = p.on_host();
            p.free(self.comm)
                .map_err(|e| Fail::lib("freeing the persistent all-reduce", e))?;
        }
        r
    }

    #[allow(clippy::type_complexity)]
    fn measure_prepared(
        &mut self,
        size: usize,
        l: &Layout,
        in_place: bool,
    ) -> Result<(f64, Option<(u64, u64)>), Fail> {
        self.call(l, in_place, self.o.warmup, "warm-up", size)?;
        self.comm
            .barrier()
            .map_err(|e| Fail::lib("barrier before timing", e))?;
        let iters = match self.o.time {
            None => self.o.iters,
            Some(target) => self.iters_for(target, l, in_place, size)?,
        };
        let t0 = Instant::now();
        self.call(l, in_place, iters, "timed", size)?;
        let slowest = self.slowest(t0.elapsed().as_secs_f64() / iters as f64)?;
        if !self.o.check {
            return Ok((slowest, None));
        }
        self.prepare(l, in_place)?;
        self.call(l, in_place, 1, "checked", size)?;
        self.fetch(l, in_place)?;
        let wrong = self.count_wrong(l, in_place) as i64;
        let mut total = [0i64; 2];
        self.comm
            .all_reduce(&[wrong, i64::from(wrong > 0)], &mut total, RedOp::Sum)
            .map_err(|e| Fail::lib("all_reduce of the wrong counts (sum)", e))?;
        Ok((slowest, Some((total[0] as u64, total[1] as u64))))
    }

    /// The slowest rank's value of `mine` (a time).
    fn slowest(&self, mine: f64) -> Result<f64, Fail> {
        let mut max = [0.0f64];
        self.comm
            .all_reduce(&[mine], &mut max, RedOp::Max)
            .map_err(|e| Fail::lib("all_reduce of the times (max)", e))?;
        Ok(max[0])
    }

    /// `-T`: the count of calls whose loop lasts about `target` seconds on
    /// the slowest rank (see [`count_for_time`]); never fewer than `-n`.
    fn iters_for(
        &mut self,
        target: f64,
        l: &Layout,
        in_place: bool,
        size: usize,
    ) -> Result<usize, Fail> {
        let least = self.o.iters;
        count_for_time(target, least, |k| {
            let t0 = Instant::now();
            self.call(l, in_place, k, "loop sizing", size)?;
            self.slowest(t0.elapsed().as_secs_f64())
        })
    }

    /// Wrong elements in this rank's result.
    fn count_wrong(&self, l: &Layout, in_place: bool) -> u64 {
        let (me, n, c, p) = (self.me as usize, self.n, l.count, self.pattern);
        let root = self.o.root;
        let out = &self.recv;
        match self.o.coll {
            Coll::AllReduce => count_wrong(&out[..c], |i| p.reduced::<T>(i)),
            Coll::Reduce if self.me != root => 0,
            Coll::Reduce => count_wrong(&out[..c], |i| p.reduced::<T>(i)),
            Coll::Broadcast => count_wrong(&out[..c], |i| p.input::<T>(root, i)),
            Coll::ReduceScatter => {
                let at = if in_place { me * c } else { 0 };
                count_wrong(&out[at..at + c], |i| p.reduced::<T>(me * c + i))
            }
            Coll::AllGather => {
                // Element k is element k % c of rank k / c's input (c > 0
                // whenever there is an element).
                let c = c.max(1);
                count_wrong(&out[..n as usize * l.count], |k| {
                    p.input::<T>((k / c) as u32, k % c)
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_nccl_tests() {
        // all-reduce: count = size / esz, size column = count · esz.
        let l = layout(Coll::AllReduce, 1 << 20, 4, 4);
        assert_eq!(
            l,
            Layout {
                count: 262144,
                send: 262144,
                recv: 262144,
                bytes: 1 << 20
            }
        );
        assert_eq!(layout(Coll::AllReduce, 6, 4, 2).bytes, 4);
        assert_eq!(
            layout(Coll::Broadcast, 10, 2, 3),
            Layout {
                count: 5,
                send: 5,
                recv: 5,
                bytes: 10
            }
        );
        // reduce-scatter: per-rank chunk of whole 16-byte units; size = send buffer.
        let rs = layout(Coll::ReduceScatter, 1 << 20, 4, 3);
        assert_eq!(rs.count, (262144 / 3) & !3);
        assert_eq!(
            (rs.send, rs.recv, rs.bytes),
            (rs.count * 3, rs.count, rs.count * 3 * 4)
        );
        // all-gather: size = receive buffer.
        let ag = layout(Coll::AllGather, 1 << 20, 8, 4);
        assert_eq!(
            ag,
            Layout {
                count: 32768,
                send: 32768,
                recv: 131072,
                bytes: 1 << 20
            }
        );
        // Small sizes round down to nothing, as nccl-tests' rows of size 0 do.
        assert_eq!(layout(Coll::AllGather, 8, 4, 2).count, 0);
        assert_eq!(
            layout(Coll::AllGather, 64, 4, 2),
            Layout {
                count: 8,
                send: 8,
                recv: 16,
                bytes: 64
            }
        );
        assert_eq!(layout(Coll::ReduceScatter, 64, 1, 4).count, 16);
        assert_eq!(layout(Coll::ReduceScatter, 64, 1, 3).count, 16);
        for coll in Coll::ALL {
            for n in 1..=8 {
                for esz in [1, 2, 4, 8] {
                    for size in [8, 100, 4096, 1 << 20] {
                        let l = layout(coll, size, esz, n);
                        assert!(l.bytes <= size);
                        assert_eq!(l.bytes, l.in_place() * esz);
                        if matches!(coll, Coll::ReduceScatter | Coll::AllGather) {
                            assert_eq!(l.in_place(), l.count * n);
                            assert_eq!(l.count * esz % 16, 0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn algorithm_header() {
        assert_eq!(
            algorithm_text(
                Coll::AllReduce,
                None,
                None,
                "auto (tree ≤ 65536 B, ring above)"
            ),
            "auto (tree ≤ 65536 B, ring above)"
        );
        assert_eq!(
            algorithm_text(Coll::AllReduce, Some(Algo::Rhd), None, "auto"),
            "rhd"
        );
        assert_eq!(
            algorithm_text(Coll::AllReduce, None, Some(Algo::Ring), "auto"),
            "auto: ring (GW_ALGO)"
        );
        assert_eq!(algorithm_text(Coll::AllGather, None, None, "auto"), "ring");
    }
}
