//! The store's hand-written codec against a serde-derived encoding of the
//! same messages (postcard), to decide whether the hand codec earns its keep
//! (see CODEC-DECISION.md).
//!
//! Measured: encode+decode time and encoded size of representative frames,
//! and what each decoder allocates and answers when a peer declares lengths
//! it never sends.
//!
//! Postcard has no framing that fits a 16 MiB value (its COBS accumulator is a
//! fixed array), so the serde side gets the framing any replacement would
//! need: `[len: u32 LE][postcard body]`, buffered as bytes arrive, refused on
//! the header when over the largest frame, with the key and value caps
//! checked after decoding. Its values are measured both as plain `Vec<u8>`
//! (what `#[derive]` gives) and with `serde_bytes` (what a careful port would
//! write), since the two decode very differently.
//!
//! `cargo bench -p gw-rendezvous --bench codec`; GW_BENCH_SECS (default 0.3)
//! sets the time per sample, GW_BENCH_ROUNDS (default 5) the interleaved
//! rounds. Without `--bench` (as `cargo test --all-targets` runs it) it only
//! checks that every case round-trips and prints the hostile-input table, in
//! about a second. Every implementation runs under the same counting
//! allocator, so its small cost is shared alike.

use gw_rendezvous::PeerInfo;
use gw_rendezvous::store::codec::{
    Decoder, Limits, MAX_MESSAGE_BYTES, MAX_TOKEN_BYTES, Message, PROTOCOL_VERSION, Request,
    Response,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Heap accounting: "does it allocate before the bytes arrive" is answered by
// the peak of live heap bytes while a decoder is fed hostile input.

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

fn shrank(n: usize) {
    LIVE.fetch_sub(n, Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the wrapper only
// counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(p, l) };
        shrank(l.size());
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                grew(new - l.size());
            } else {
                shrank(l.size() - new);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the most heap it held at once,
/// beyond what was live before it started.
fn peak_heap<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let r = f();
    (r, PEAK.load(Relaxed) - base)
}

// ---------------------------------------------------------------------------
// The serde side: the same messages, derived. `B` is a value's byte string.

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum SReq<B> {
    Hello { version: u32, token: String },
    Set { key: String, value: B },
    Get { key: String },
    Wait { keys: Vec<String>, timeout_ms: u64 },
    Check { keys: Vec<String> },
    Add { key: String, delta: i64 },
    Delete { key: String },
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum SResp<B> {
    Welcome {
        max_key_bytes: u64,
        max_value_bytes: u64,
    },
    Refused(String),
    Ok,
    Value(Option<B>),
    Values(Vec<B>),
    TimedOut {
        missing: Vec<String>,
    },
    Exists(Vec<bool>),
    Counter(i64),
    Deleted(bool),
    Error(String),
}

fn sreq<B: From<Vec<u8>>>(r: &Request) -> SReq<B> {
    match r.clone() {
        Request::Hello { version, token } => SReq::Hello { version, token },
        Request::Set { key, value } => SReq::Set {
            key,
            value: value.into(),
        },
        Request::Get { key } => SReq::Get { key },
        Request::Wait { keys, timeout_ms } => SReq::Wait { keys, timeout_ms },
        Request::Check { keys } => SReq::Check { keys },
        Request::Add { key, delta } => SReq::Add { key, delta },
        Request::Delete { key } => SReq::Delete { key },
    }
}

fn sresp<B: From<Vec<u8>>>(r: &Response) -> SResp<B> {
    match r.clone() {
        Response::Welcome {
            max_key_bytes,
            max_value_bytes,
        } => SResp::Welcome {
            max_key_bytes,
            max_value_bytes,
        },
        Response::Refused(m) | Response::Busy(m) => SResp::Refused(m),
        Response::Ok => SResp::Ok,
        Response::Value(v) => SResp::Value(v.map(Into::into)),
        Response::Values(v) => SResp::Values(v.into_iter().map(Into::into).collect()),
        Response::TimedOut { missing } => SResp::TimedOut { missing },
        Response::Exists(v) => SResp::Exists(v),
        Response::Counter(n) => SResp::Counter(n),
        Response::Deleted(d) => SResp::Deleted(d),
        Response::Error(m) => SResp::Error(m),
    }
}

/// The field caps the hand codec checks while decoding; a serde decoder
/// only sees them afterwards.
trait Capped {
    fn check(&self, l: &Limits) -> Result<(), String>;
}

fn cap(what: &str, n: usize, max: usize) -> Result<(), String> {
    if n > max {
        Err(format!("{what} of {n} bytes exceeds the limit of {max}"))
    } else {
        Ok(())
    }
}

fn cap_keys(keys: &[String], l: &Limits) -> Result<(), String> {
    keys.iter()
        .try_for_each(|k| cap("key", k.len(), l.max_key_bytes))
}

impl<B: AsRef<[u8]>> Capped for SReq<B> {
    fn check(&self, l: &Limits) -> Result<(), String> {
        match self {
            SReq::Hello { token, .. } => cap("token", token.len(), MAX_TOKEN_BYTES),
            SReq::Set { key, value } => {
                cap("key", key.len(), l.max_key_bytes)?;
                cap("value", value.as_ref().len(), l.max_value_bytes)
            }
            SReq::Get { key } | SReq::Add { key, .. } | SReq::Delete { key } => {
                cap("key", key.len(), l.max_key_bytes)
            }
            SReq::Wait { keys, .. } | SReq::Check { keys } => cap_keys(keys, l),
        }
    }
}

impl<B: AsRef<[u8]>> Capped for SResp<B> {
    fn check(&self, l: &Limits) -> Result<(), String> {
        match self {
            SResp::Refused(m) | SResp::Error(m) => cap("message", m.len(), MAX_MESSAGE_BYTES),
            SResp::Value(Some(v)) => cap("value", v.as_ref().len(), l.max_value_bytes),
            SResp::Values(vs) => vs
                .iter()
                .try_for_each(|v| cap("value", v.as_ref().len(), l.max_value_bytes)),
            SResp::TimedOut { missing } => cap_keys(missing, l),
            _ => Ok(()),
        }
    }
}

/// `[len: u32 LE][postcard body]`.
fn pc_encode<M: Serialize>(m: &M) -> Vec<u8> {
    let mut out = postcard::to_extend(m, vec![0u8; 4]).expect("postcard encodes every message");
    let n = u32::try_from(out.len() - 4).expect("bench frames are under 4 GiB");
    out[..4].copy_from_slice(&n.to_le_bytes());
    out
}

/// The serde side's incremental decoder, shaped like the hand codec's.
struct Framed<M> {
    buf: Vec<u8>,
    /// Largest body: the frame's tag is postcard's first varint, which the
    /// framing cannot read without knowing postcard's encoding, so one cap
    /// covers every kind of frame.
    max_body: usize,
    limits: Limits,
    _msg: PhantomData<fn() -> M>,
}

impl<M: DeserializeOwned + Capped> Framed<M> {
    fn new(max_body: usize, limits: Limits) -> Self {
        Framed {
            buf: Vec::new(),
            max_body,
            limits,
            _msg: PhantomData,
        }
    }

    fn push(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    fn next_frame(&mut self) -> Result<Option<M>, String> {
        let Some(h) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len > self.max_body {
            return Err(format!(
                "frame of {len} bytes exceeds the largest allowed ({})",
                self.max_body
            ));
        }
        let total = 4 + len;
        if self.buf.len() < total {
            return Ok(None);
        }
        let (m, rest) =
            postcard::take_from_bytes::<M>(&self.buf[4..total]).map_err(|e| e.to_string())?;
        if !rest.is_empty() {
            return Err(format!("{} trailing bytes", rest.len()));
        }
        m.check(&self.limits)?;
        self.buf.drain(..total);
        if self.buf.is_empty() && self.buf.capacity() > (1 << 20) {
            self.buf = Vec::new();
        }
        Ok(Some(m))
    }
}

/// The largest body the hand codec accepts for any tag.
fn any_cap<M: Message>(l: &Limits) -> usize {
    (0..=u8::MAX)
        .filter_map(|t| M::frame_cap(t, l).ok())
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Speed and size.

/// Timed implementations.
const TIMED: [&str; 3] = ["hand", "postcard+serde_bytes", "postcard plain"];
/// Implementations fed hostile input.
const FED: [&str; 3] = ["hand", "postcard+serde_bytes", "postcard (plain derive)"];

struct Case {
    name: String,
    /// Encoded frame bytes per implementation.
    bytes: [usize; 3],
    /// One encode, push and decode per call.
    run: [Box<dyn FnMut()>; 3],
}

/// One encode, push and decode per call of the returned closure, with the
/// encoded size; checked once before it is timed.
fn case<M, D>(
    msg: M,
    mut dec: D,
    encode: fn(&M) -> Vec<u8>,
    step: fn(&mut D, &[u8]) -> Option<M>,
) -> (usize, Box<dyn FnMut()>)
where
    M: PartialEq + std::fmt::Debug + 'static,
    D: 'static,
{
    let enc = encode(&msg);
    assert_eq!(step(&mut dec, &enc).as_ref(), Some(&msg));
    let run = move || {
        let bytes = encode(black_box(&msg));
        black_box(step(&mut dec, &bytes));
    };
    (enc.len(), Box::new(run))
}

fn hand_encode<M: Message>(m: &M) -> Vec<u8> {
    m.encode().expect("bench messages fit a frame")
}

fn hand_case<M>(msg: M, l: Limits) -> (usize, Box<dyn FnMut()>)
where
    M: Message + PartialEq + std::fmt::Debug + 'static,
{
    case(msg, Decoder::<M>::new(l), hand_encode, |d, b| {
        d.push(b);
        d.next_frame().expect("decodes")
    })
}

fn serde_case<M>(msg: M, max_body: usize, l: Limits) -> (usize, Box<dyn FnMut()>)
where
    M: Serialize + DeserializeOwned + Capped + PartialEq + std::fmt::Debug + 'static,
{
    case(msg, Framed::<M>::new(max_body, l), pc_encode, |d, b| {
        d.push(b);
        d.next_frame().expect("decodes")
    })
}

fn req_case(name: &str, r: Request, l: Limits) -> Case {
    let cap = any_cap::<Request>(&l);
    let (a, ra) = hand_case(r.clone(), l);
    let (b, rb) = serde_case(sreq::<ByteBuf>(&r), cap, l);
    let (c, rc) = serde_case(sreq::<Vec<u8>>(&r), cap, l);
    Case {
        name: name.into(),
        bytes: [a, b, c],
        run: [ra, rb, rc],
    }
}

fn resp_case(name: &str, r: Response, l: Limits) -> Case {
    let cap = any_cap::<Response>(&l);
    let (a, ra) = hand_case(r.clone(), l);
    let (b, rb) = serde_case(sresp::<ByteBuf>(&r), cap, l);
    let (c, rc) = serde_case(sresp::<Vec<u8>>(&r), cap, l);
    Case {
        name: name.into(),
        bytes: [a, b, c],
        run: [ra, rb, rc],
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 % 251) as u8).collect()
}

fn cases() -> Vec<Case> {
    let l = Limits::default();
    let peer_key = |r: usize| format!("gw/comm0/peer/{r}");
    // What a Wait at bring-up returns: every rank's published record.
    let records: Vec<Vec<u8>> = (0..64u32)
        .map(|rank| {
            PeerInfo {
                rank,
                host_id: "4f3c2a1e-9b7d-4c8e-a1f2-3d4e5f607182-4026531840".into(),
                hostname: format!("node{:03}", rank / 8),
                pid: 100_000 + rank,
                tcp: vec![
                    format!("10.0.{}.{}:29500", rank / 8, rank % 8)
                        .parse()
                        .unwrap(),
                ],
                tcp_eager: gw_rendezvous::peers::Eager {
                    frames: 4,
                    frame_bytes: 1 << 20,
                    small_frames: 32,
                    small_bytes: 4096,
                },
                ofi: String::new(),
                cores: 0,
                cpus: Vec::new(),
                fan_out: None,
            }
            .encode()
            .into_bytes()
        })
        .collect();
    let rec_len = records.iter().map(Vec::len).sum::<usize>() / records.len();
    vec![
        req_case(
            "Hello (32 B token)",
            Request::Hello {
                version: PROTOCOL_VERSION,
                token: "0123456789abcdef0123456789abcdef".into(),
            },
            l,
        ),
        req_case(
            "Set small (15 B key, 16 B value)",
            Request::Set {
                key: peer_key(3),
                value: pattern(16),
            },
            l,
        ),
        req_case(
            "Set 1 KiB value",
            Request::Set {
                key: "gw/comm0/model".into(),
                value: pattern(1 << 10),
            },
            l,
        ),
        req_case(
            "Set 1 MiB value",
            Request::Set {
                key: "gw/comm0/blob".into(),
                value: pattern(1 << 20),
            },
            l,
        ),
        req_case(
            "Wait 64 keys",
            Request::Wait {
                keys: (0..64).map(peer_key).collect(),
                timeout_ms: 60_000,
            },
            l,
        ),
        resp_case(
            "Welcome (Hello's reply)",
            Response::Welcome {
                max_key_bytes: l.max_key_bytes as u64,
                max_value_bytes: l.max_value_bytes as u64,
            },
            l,
        ),
        resp_case("Ok (Set's reply)", Response::Ok, l),
        resp_case(
            "Value 1 KiB (Get's reply)",
            Response::Value(Some(pattern(1 << 10))),
            l,
        ),
        resp_case(
            "Value 1 MiB (Get's reply)",
            Response::Value(Some(pattern(1 << 20))),
            l,
        ),
        resp_case(
            &format!("Values 64 x {rec_len} B (Wait's reply)"),
            Response::Values(records),
            l,
        ),
    ]
}

fn time(f: &mut dyn FnMut(), iters: u64) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed()
}

/// Iterations that take about `target`.
fn calibrate(f: &mut dyn FnMut(), target: Duration) -> u64 {
    let mut n = 1u64;
    loop {
        let t = time(f, n);
        if t >= Duration::from_millis(20) || n >= 1 << 30 {
            let per = t.as_secs_f64() / n as f64;
            return ((target.as_secs_f64() / per) as u64).max(1);
        }
        n *= 2;
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

fn fmt_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn speed(mut cases: Vec<Case>, secs: f64, rounds: usize) {
    const N: usize = TIMED.len();
    let target = Duration::from_secs_f64(secs);
    let iters: Vec<[u64; N]> = cases
        .iter_mut()
        .map(|c| {
            let mut n = [0; N];
            for (i, f) in c.run.iter_mut().enumerate() {
                n[i] = calibrate(f.as_mut(), target);
            }
            n
        })
        .collect();
    // ns per round trip: [case][impl][round]. Each round visits every case
    // and rotates the order of the implementations, so that drift in the
    // machine's speed lands on all of them alike, and ratios are taken
    // within a round.
    let mut ns = vec![std::array::from_fn::<Vec<f64>, N, _>(|_| vec![]); cases.len()];
    for round in 0..rounds {
        for (ci, c) in cases.iter_mut().enumerate() {
            for k in 0..N {
                let i = (k + round) % N;
                let t = time(c.run[i].as_mut(), iters[ci][i]);
                ns[ci][i].push(t.as_secs_f64() * 1e9 / iters[ci][i] as f64);
            }
        }
    }

    println!("\nEncoded frame size, bytes (postcard's include the same 4-byte length prefix):");
    println!(
        "  {:<36} {:>9} {:>9} {:>9}",
        "case", "hand", "postcard", "pc/hand"
    );
    for c in &cases {
        println!(
            "  {:<36} {:>9} {:>9} {:>9.2}",
            c.name,
            c.bytes[0],
            c.bytes[1],
            c.bytes[1] as f64 / c.bytes[0] as f64
        );
    }

    println!(
        "\nEncode + decode of one frame through an incremental decoder: median of {rounds} \
         interleaved rounds of ~{secs} s each, ±spread = (max - min) / median over the rounds."
    );
    print!("  {:<36}", "case");
    for name in TIMED {
        print!(" {name:>22}");
    }
    println!();
    for (ci, c) in cases.iter().enumerate() {
        print!("  {:<36}", c.name);
        for t in &ns[ci] {
            let m = median(t);
            let (lo, hi) = min_max(t);
            print!(
                " {:>22}",
                format!("{} ±{:.0}%", fmt_ns(m), (hi - lo) / m * 100.0)
            );
        }
        println!();
    }

    println!(
        "\nTime ratios, median of the per-round ratios [min - max over rounds]; > 1: the hand codec is faster."
    );
    let pairs = [(1, 0), (2, 0)];
    print!("  {:<36}", "case");
    for (a, b) in pairs {
        print!(" {:>24}", format!("{} / {}", TIMED[a], TIMED[b]));
    }
    println!();
    for (ci, c) in cases.iter().enumerate() {
        print!("  {:<36}", c.name);
        for (a, b) in pairs {
            let r: Vec<f64> = ns[ci][a]
                .iter()
                .zip(&ns[ci][b])
                .map(|(x, y)| x / y)
                .collect();
            let (lo, hi) = min_max(&r);
            print!(" {:>24}", format!("{:.2} [{lo:.2}-{hi:.2}]", median(&r)));
        }
        println!();
    }
}

// ---------------------------------------------------------------------------
// Hostile input.

/// What a decoder made of the bytes fed to it.
fn outcome<T>(r: Result<Option<T>, String>, fed: usize) -> String {
    match r {
        Ok(Some(_)) => format!("accepted a frame ({fed} B fed)"),
        Ok(None) => format!("waits for more ({fed} B fed)"),
        Err(e) => {
            let mut e = e;
            if e.len() > 58 {
                let mut end = 58;
                while !e.is_char_boundary(end) {
                    end -= 1;
                }
                e.truncate(end);
                e.push_str("...");
            }
            format!("refused: {e}")
        }
    }
}

/// Feeds `bytes` in server-sized reads (64 KiB), stopping at the first
/// frame or error, and reports the outcome and the peak heap.
fn feed_hand(bytes: &[u8], l: Limits) -> (String, usize) {
    peak_heap(|| {
        let mut d = Decoder::<Request>::new(l);
        let mut last = Ok(None);
        for chunk in bytes.chunks(64 << 10) {
            d.push(chunk);
            last = d.next_frame().map_err(|e| e.to_string());
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        outcome(last, bytes.len())
    })
}

fn feed_serde<B>(bytes: &[u8], l: Limits) -> (String, usize)
where
    SReq<B>: DeserializeOwned + Capped,
{
    peak_heap(|| {
        let mut d = Framed::<SReq<B>>::new(any_cap::<Request>(&l), l);
        let mut last = Ok(None);
        for chunk in bytes.chunks(64 << 10) {
            d.push(chunk);
            last = d.next_frame();
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        outcome(last, bytes.len())
    })
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A hand frame: `[len][tag]body`, `len` as given (it may lie).
fn hand_frame(len: u32, tag: u8, body: &[u8]) -> Vec<u8> {
    let mut f = len.to_le_bytes().to_vec();
    f.push(tag);
    f.extend_from_slice(body);
    f
}

/// A postcard frame: `[len]body`, `len` as given, or the true length.
fn pc_frame(len: Option<u32>, body: &[u8]) -> Vec<u8> {
    let len = len.unwrap_or(body.len() as u32);
    let mut f = len.to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn le32(n: u32) -> [u8; 4] {
    n.to_le_bytes()
}

/// A Check frame whose body (after the tag) is `body` bytes of empty keys.
fn empty_keys(body: usize) -> (Vec<u8>, Vec<u8>) {
    const CHECK: u8 = 0x05;
    const PC_CHECK: u8 = 4;
    let n = (body - 4) / 4;
    let mut hb = le32(n as u32).to_vec();
    hb.resize(4 + 4 * n, 0);
    // Postcard: the variant, the count, then one zero byte per key, `body`
    // bytes in all (the count's varint is no longer than `body`'s).
    let mut pb = vec![PC_CHECK];
    varint(body as u64, &mut pb);
    let n = body - pb.len();
    pb.truncate(1);
    varint(n as u64, &mut pb);
    pb.resize(pb.len() + n, 0);
    (
        hand_frame(1 + hb.len() as u32, CHECK, &hb),
        pc_frame(None, &pb),
    )
}

fn hostile(full: bool) {
    const SET: u8 = 0x02;
    const WAIT: u8 = 0x04;
    // Postcard's variant indices, in the declaration order of `SReq`.
    const PC_SET: u8 = 1;
    const PC_GET: u8 = 2;
    const PC_WAIT: u8 = 3;
    let l = Limits::default();
    let set_cap = Request::frame_cap(SET, &l).expect("Set has a cap") as u32;
    let pc_cap = any_cap::<Request>(&l) as u32;

    let mut rows: Vec<(&str, Vec<u8>, Vec<u8>)> = Vec::new();

    // 1. The length prefix alone claims 4 GiB.
    rows.push((
        "1. header declares a 4 GiB frame (5 B sent)",
        hand_frame(u32::MAX, SET, &[]),
        pc_frame(Some(u32::MAX), &[PC_SET]),
    ));

    // 2. A frame within the cap whose value length claims 4 GiB.
    let mut hb = le32(1).to_vec();
    hb.push(b'k');
    hb.extend_from_slice(&le32(u32::MAX));
    let mut pb = vec![PC_SET, 1, b'k'];
    varint(u32::MAX.into(), &mut pb);
    rows.push((
        "2a. Set, frame len = max, value len = 4 GiB",
        hand_frame(set_cap, SET, &hb),
        pc_frame(Some(pc_cap), &pb),
    ));
    rows.push((
        "2b. same, frame len = bytes sent",
        hand_frame(1 + hb.len() as u32, SET, &hb),
        pc_frame(None, &pb),
    ));

    // 3. A key list whose count claims 2^32 - 1 entries.
    let mut hb = 60_000u64.to_le_bytes().to_vec();
    hb.extend_from_slice(&le32(u32::MAX));
    let mut pb = vec![PC_WAIT];
    varint(u32::MAX.into(), &mut pb);
    rows.push((
        "3. Wait, 2^32-1 keys in a tiny frame",
        hand_frame(1 + hb.len() as u32, WAIT, &hb),
        pc_frame(None, &pb),
    ));

    // 4. Before authentication: a maximal Set trickled in. Both buffer what
    // arrives; neither refuses until the frame is complete (the rule that
    // only a small Hello is decoded before authentication is still to come).
    let sent = 1 << 20;
    let mut hb = le32(1).to_vec();
    hb.push(b'k');
    hb.extend_from_slice(&le32(l.max_value_bytes as u32));
    hb.resize(sent, 7);
    let mut pb = vec![PC_SET, 1, b'k'];
    varint(l.max_value_bytes as u64, &mut pb);
    pb.resize(sent, 7);
    rows.push((
        "4. Set declaring 16 MiB, 1 MiB sent",
        hand_frame(set_cap, SET, &hb),
        pc_frame(Some(pc_cap), &pb),
    ));

    // 5. Heap per byte received: Check frames of empty keys (the cheapest
    // element each format has: 4 bytes here, 1 byte in postcard).
    let (h, p) = empty_keys(1 << 20);
    rows.push(("5a. Check, 1 MiB of empty keys", h, p));
    if full {
        let (h, p) = empty_keys(l.max_value_bytes);
        rows.push(("5b. Check, 16 MiB (the list cap) of empty keys", h, p));
    }

    // 6. One Get with two encodings: key length 1 as a two-byte varint.
    rows.push((
        "6. Get, key len as overlong varint",
        Vec::new(),
        pc_frame(None, &[PC_GET, 0x81, 0x00, b'k']),
    ));

    println!(
        "\nHostile input, fed in 64 KiB reads to a fresh decoder (default limits: 4 KiB keys, 16 MiB values);"
    );
    println!("heap = most heap bytes the decoder held at once, beyond what was live before.");
    for (name, h, p) in rows {
        println!("  {name}");
        let cells = [
            if h.is_empty() {
                ("n/a: fixed-width lengths have one encoding".to_string(), 0)
            } else {
                feed_hand(&h, l)
            },
            feed_serde::<ByteBuf>(&p, l),
            feed_serde::<Vec<u8>>(&p, l),
        ];
        for (i, (out, heap)) in cells.iter().enumerate() {
            println!("    {:<24} heap {:>10} B  {out}", FED[i], heap);
        }
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (secs, rounds) = if bench {
        (env_or("GW_BENCH_SECS", 0.3), env_or("GW_BENCH_ROUNDS", 5))
    } else {
        (0.0, 1)
    };
    println!(
        "gw-rendezvous store codec: hand-written vs serde + postcard {}",
        if bench { "" } else { "(smoke run)" }
    );
    hostile(bench);
    if bench {
        speed(cases(), secs, rounds);
    } else {
        for mut c in cases() {
            for f in &mut c.run {
                f();
            }
        }
    }
}
