//! Driving two transports of one process by hand until their requests are
//! done: what every backend's tests do between posting and checking, and
//! the buffers they register for it.

use crate::seam::{MemHandle, Outstanding, Rank, Tag, Transport};
use std::time::{Duration, Instant};

/// Progresses `a` and `b` until every request of `ra` (on `a`) and `rb`
/// (on `b`) completes; fails the test past `limit`.
pub(crate) fn run_both<T: Transport>(
    a: &mut T,
    b: &mut T,
    ra: Vec<impl Into<Outstanding>>,
    rb: Vec<impl Into<Outstanding>>,
    limit: Duration,
) {
    let mut ra: Vec<Outstanding> = ra.into_iter().map(Into::into).collect();
    let mut rb: Vec<Outstanding> = rb.into_iter().map(Into::into).collect();
    let deadline = Instant::now() + limit;
    while !(ra.is_empty() && rb.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "transfers did not finish: {ra:?} {rb:?}"
        );
        a.progress().unwrap();
        b.progress().unwrap();
        ra.retain_mut(|r| !r.poll(&mut *a).unwrap());
        rb.retain_mut(|r| !r.poll(&mut *b).unwrap());
    }
}

/// Registers `buf` with `t`.
pub(crate) fn reg<T: Transport + ?Sized>(t: &mut T, buf: &mut [u8]) -> MemHandle {
    // SAFETY: every test keeps the buffer alive and untouched until its
    // transfers are done, and drops the transports first.
    unsafe { t.register(buf.as_mut_ptr(), buf.len()) }.unwrap()
}

/// One message of each size (message k filled by `pattern(len, k)`)
/// registered with `a`, and a zeroed destination for each registered with
/// `b`: the vectors and their handles.
pub(crate) struct Messages {
    pub src: Vec<Vec<u8>>,
    pub dst: Vec<Vec<u8>>,
    pub ms: Vec<MemHandle>,
    pub md: Vec<MemHandle>,
}

impl Messages {
    pub fn new<T: Transport>(
        a: &mut T,
        b: &mut T,
        sizes: &[usize],
        pattern: fn(usize, u8) -> Vec<u8>,
    ) -> Messages {
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &len)| pattern(len, k as u8))
            .collect();
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|&len| vec![0u8; len]).collect();
        let ms = src.iter_mut().map(|v| reg(a, v)).collect();
        let md = dst.iter_mut().map(|v| reg(b, v)).collect();
        Messages { src, dst, ms, md }
    }
}

/// `len` bytes that differ with `seed` and along the buffer.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// (offset, length) of consecutive messages of `sizes` bytes in one buffer.
pub(crate) fn offsets(sizes: &[usize]) -> Vec<(usize, usize)> {
    sizes
        .iter()
        .scan(0, |o, &n| {
            let r = (*o, n);
            *o += n;
            Some(r)
        })
        .collect()
}

/// Rank 1 (`b`) asks for message `t` from rank 0 (`a`) with `recv_now`
/// until the answer is no longer `Empty`, progressing `a` meanwhile; fails
/// the test past `limit`.
pub(crate) fn recv_now_within<T: Transport>(
    a: &mut T,
    b: &mut T,
    t: Tag,
    dst: &mut [u8],
    limit: Duration,
) -> crate::Result<crate::seam::Now> {
    let deadline = Instant::now() + limit;
    loop {
        a.progress()?;
        match b.recv_now(0, t, dst)? {
            crate::seam::Now::Empty => assert!(Instant::now() < deadline, "nothing came for {t}"),
            now => return Ok(now),
        }
    }
}

/// Rank 0 (`a`) sends rank 1 (`b`) one message of each `(len, send at
/// once, receive at once)`, every message `k` tagged `tag(k)`: sent with
/// `send_now` where asked and possible, else posted; received with
/// `recv_now` where asked (looking until it is no longer `Empty`), else
/// posted. Returns what was sent and what arrived, one buffer each, for the
/// caller to compare.
pub(crate) fn mixed_paths<T: Transport>(
    a: &mut T,
    b: &mut T,
    msgs: &[(usize, bool, bool)],
    tag: impl Fn(u32) -> Tag,
    limit: Duration,
) -> (Vec<u8>, Vec<u8>) {
    use crate::seam::Now;
    let sizes: Vec<usize> = msgs.iter().map(|m| m.0).collect();
    let parts = offsets(&sizes);
    let total = sizes.iter().sum();
    let mut src = pattern(total, 9);
    let mut dst = vec![0u8; total];
    let (ms, md) = (reg(a, &mut src), reg(b, &mut dst));
    let mut sends = vec![];
    for (k, (&(o, n), m)) in parts.iter().zip(msgs).enumerate() {
        let t = tag(k as u32);
        if m.1 && a.send_now(1, t, &src[o..o + n], None).unwrap() == Now::Done {
            continue;
        }
        sends.push(a.isend(1, t, ms, o, n).unwrap());
        a.progress().unwrap();
    }
    let mut recvs = vec![];
    for (k, (&(o, n), m)) in parts.iter().zip(msgs).enumerate() {
        let t = tag(k as u32);
        let at_once =
            m.2 && recv_now_within(a, b, t, &mut dst[o..o + n], limit).unwrap() == Now::Done;
        if !at_once {
            recvs.push(b.irecv(0, t, md, o, n).unwrap());
        }
    }
    run_both(a, b, sends, recvs, limit);
    (src, dst)
}

/// One rank of [`exchange_waiting_for_sends`].
struct Exchanger<'t, T: Transport> {
    t: &'t mut T,
    peer: Rank,
    src: MemHandle,
    dst: MemHandle,
    parts: &'t [(usize, usize)],
    window: usize,
    ahead: usize,
    tag: fn(u32) -> Tag,
    sends: Vec<Option<Outstanding>>,
    recvs: Vec<Option<Outstanding>>,
    sent: Vec<bool>,
    got: Vec<bool>,
}

impl<T: Transport> Exchanger<'_, T> {
    fn done(&self) -> bool {
        self.got.iter().all(|&g| g)
    }

    /// Posts what may be posted, tests what runs, and progresses once.
    fn turn(&mut self) -> crate::Result<()> {
        let received = self.got.iter().take_while(|&&g| g).count();
        for k in 0..self.parts.len().min(received + self.ahead) {
            if self.sends[k].is_none() && !self.sent[k] {
                let (o, n) = self.parts[k];
                let tag = (self.tag)(k as u32);
                self.sends[k] = Some(self.t.isend(self.peer, tag, self.src, o, n)?.into());
            }
        }
        for k in 0..self.parts.len() {
            if let Some(s) = self.sends[k].as_mut()
                && s.poll(&mut *self.t)?
            {
                self.sends[k] = None;
                self.sent[k] = true;
            }
            let ready = k < self.window || self.sent[k - self.window];
            if ready && self.recvs[k].is_none() && !self.got[k] {
                let (o, n) = self.parts[k];
                let tag = (self.tag)(k as u32);
                self.recvs[k] = Some(self.t.irecv(self.peer, tag, self.dst, o, n)?.into());
            }
            if let Some(r) = self.recvs[k].as_mut()
                && r.poll(&mut *self.t)?
            {
                self.recvs[k] = None;
                self.got[k] = true;
            }
        }
        self.t.progress()?;
        Ok(())
    }
}

/// Ranks 0 (`a`) and 1 (`b`) exchange messages of `sizes` bytes, message k
/// both ways under tag `tag(k)`, and each posts its receive of message k
/// only once its own send of message k - `window` is done (the first
/// `window` at once), as an rd all-reduce's receive waits for a scratch
/// slot that the reduce of an earlier message frees only after that
/// message's send (the reduce overwrites what is sent). Sends run at most
/// `ahead` past the receives done in order. The ranks turn in the rhythm
/// `turns` (true: `a`), repeated, each at least once a cycle. Fails if the
/// exchange is not done within 10 s (far more than a busy CI machine
/// needs), or a byte is wrong. The transports are taken so that they are
/// dropped before the buffers they hold, however this returns.
pub(crate) fn exchange_waiting_for_sends<T: Transport>(
    a: T,
    b: T,
    sizes: &[usize],
    (window, ahead): (usize, usize),
    turns: &[bool],
    tag: fn(u32) -> Tag,
) -> Result<(), String> {
    let parts = offsets(sizes);
    let total = sizes.iter().sum();
    let (mut a_src, mut b_src) = (pattern(total, 31), pattern(total, 41));
    let (mut a_dst, mut b_dst) = (vec![0u8; total], vec![0u8; total]);
    let (mut a, mut b) = (a, b);
    let (sa, da) = (reg(&mut a, &mut a_src), reg(&mut a, &mut a_dst));
    let (sb, db) = (reg(&mut b, &mut b_src), reg(&mut b, &mut b_dst));
    let new = |t, peer, src, dst| Exchanger {
        t,
        peer,
        src,
        dst,
        parts: &parts,
        window,
        ahead,
        tag,
        sends: (0..parts.len()).map(|_| None).collect(),
        recvs: (0..parts.len()).map(|_| None).collect(),
        sent: vec![false; parts.len()],
        got: vec![false; parts.len()],
    };
    let (mut ea, mut eb) = (new(&mut a, 1, sa, da), new(&mut b, 0, sb, db));
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = |e: crate::Error| e.to_string();
    while !(ea.done() && eb.done()) {
        if Instant::now() >= deadline {
            return Err(format!(
                "stuck: rank 0 got {:?} sent {:?}, rank 1 got {:?} sent {:?}",
                ea.got, ea.sent, eb.got, eb.sent
            ));
        }
        for &a_turns in turns {
            if a_turns {
                ea.turn().map_err(err)?;
            } else {
                eb.turn().map_err(err)?;
            }
        }
        ea.turn().map_err(err)?;
        eb.turn().map_err(err)?;
    }
    drop((ea, eb));
    drop((a, b));
    if a_dst != b_src || b_dst != a_src {
        return Err("the exchange delivered wrong bytes".into());
    }
    Ok(())
}
