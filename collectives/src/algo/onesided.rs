//! Ring all-reduce by one-sided writes (MiMatrix's GDRAA): the schedule a
//! persistent all-reduce runs when every peer's transport can write into
//! published memory (`Transport::write_imm`). Also the two-rank put and
//! get (`put.rs`), whose schedules are at the end of the file.
//!
//! Each rank owns a window ([`Buf::Window`]) of `n - 1` chunk slots that
//! its left neighbour writes its reduce-scatter partials into, and its
//! `Recv` buffer, which the left neighbour writes the finished chunks into
//! during the all-gather. Both are registered and published once, at init;
//! a round then costs two small messages per neighbour, whatever the size:
//!
//! 1. `Ready-RS` (step 0): "I am in this round", sent to the left
//!    neighbour when the round starts. Without it a writer a round ahead
//!    could land its next round's chunks while this rank still takes
//!    immediates for the current one.
//! 2. `Ready-AG` (step 1): "my `Recv` may be written", sent once this
//!    rank's reduce-scatter no longer reads or writes `Recv` (its writes
//!    out of it completed, its reductions into it are done). The ring's
//!    data dependencies already put the left neighbour's all-gather after
//!    that (its chunks are made of this rank's partials); the message
//!    states the rule instead of leaning on it, at one message a round.
//!
//! Data moves only as writes with immediates (segments of at most `seg`
//! elements); each says which round (added by the engine), phase, step and
//! segment it is, and the receiver waits for that immediate
//! ([`super::Action::Landed`]) before reading the bytes. The data flow is
//! the two-sided ring's (`ring.rs`): in reduce-scatter step `g` rank `r`
//! writes chunk `r - g - 1` and reduces chunk `r - g - 2` from its window;
//! in all-gather step `t` it forwards chunk `r - t` and receives `r - t - 1`.

use gw_transport::rma::{Imm, MAX_CHUNKS};
use gw_transport::{Error, Result};

use super::dag::{Alias, Builder, Desc, chunk, nsegs, segment};
use super::{Buf, Loc, OpSpec, Remote, Schedule};

/// The steps of the two `Ready` messages.
const READY_RS: u32 = 0;
const READY_AG: u32 = 1;
/// The steps of a get's two messages: the owner's `Ready`, the reader's
/// `Done`.
const READY: u32 = 0;
const DONE: u32 = 1;

/// The immediate of chunk `chunk` of persistent window `window`, round 0
/// (the engine stamps each round's number on it).
fn imm(window: u8, chunk: usize) -> u32 {
    Imm::Window {
        window,
        round: 0,
        chunk: chunk as u16,
    }
    .encode()
}

/// The one-sided ring all-reduce of `spec.count` elements on `n >= 2`
/// ranks, in writes of at most `seg` elements, its immediates naming
/// `window`. Fails when a round would need more chunks than an immediate
/// can name (the caller then runs the two-sided ring).
pub fn allreduce(spec: &OpSpec, seg: usize, window: u8) -> Result<Box<dyn Schedule>> {
    let n = spec.nranks as usize;
    let r = spec.rank as usize;
    if n < 2 {
        return Err(Error::InvalidArgument(
            "a one-sided all-reduce needs two ranks or more".into(),
        ));
    }
    let (count, seg) = (spec.count, seg.max(1));
    let right = ((r + 1) % n) as u32;
    let left = ((r + n - 1) % n) as u32;
    let back = |k: usize| (r + 2 * n - k) % n;
    let maxchunk = count.div_ceil(n);
    let m = nsegs(maxchunk, seg).max(1);
    let chunks = 2 * (n - 1) * m;
    if chunks > MAX_CHUNKS {
        return Err(Error::InvalidArgument(format!(
            "a one-sided all-reduce of {count} elements in writes of {seg} on {n} ranks needs {chunks} chunks a round; an immediate names at most {MAX_CHUNKS}"
        )));
    }
    let mut b = Builder::new(
        "one-sided ring all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        1,
    );
    b.window((n - 1) * maxchunk);
    let mut flags = b.pool(3, 1);
    let piece = |c: usize, k: usize| {
        let (coff, clen) = chunk(count, n, c);
        segment(clen, seg, k).map(|(o, l)| (coff + o, l))
    };
    let sync = Desc::new("handshake", 0, 2, 0, 1);
    let (f0, f1, f2) = (flags.slot(1), flags.slot(1), flags.slot(1));
    b.send(left, READY_RS, 0, f0, sync);
    let rs_ok = b.recv(right, READY_RS, 0, f1, sync);
    // Everything of the reduce-scatter that touches Recv (or Send, which
    // in place is Recv): the left neighbour's all-gather writes wait for it.
    let mut rs = Vec::new();
    for g in 0..n - 1 {
        for k in 0..m {
            let desc = Desc::new("reduce-scatter", g, n - 1, k, m);
            let id = g * m + k;
            if let Some((off, len)) = piece(back(g + 1), k) {
                let src = if g > 0 {
                    Loc::new(Buf::Recv, off, len)
                } else if spec.scaled {
                    let dst = Loc::new(Buf::Recv, off, len);
                    rs.push(b.copy(dst, Loc::new(Buf::Send, off, len), false, desc));
                    dst
                } else {
                    Loc::new(Buf::Send, off, len)
                };
                let slot = Remote {
                    buf: Buf::Window,
                    offset: g * maxchunk + (off - chunk(count, n, back(g + 1)).0),
                };
                let w = b.write_remote(right, src, slot, imm(window, id), desc);
                b.dep(rs_ok, w);
                rs.push(w);
            }
            if let Some((off, len)) = piece(back(g + 2), k) {
                let within = off - chunk(count, n, back(g + 2)).0;
                let slot = Loc::new(Buf::Window, g * maxchunk + within, len);
                b.landed(left, imm(window, id), slot, desc);
                let (dst, mine) = (Loc::new(Buf::Recv, off, len), Loc::new(Buf::Send, off, len));
                rs.push(b.reduce(dst, mine, slot, g == n - 2, desc));
            }
        }
    }
    let ready = b.send(left, READY_AG, 0, f0, Desc::new("handshake", 1, 2, 0, 1));
    for a in rs {
        b.dep(a, ready);
    }
    let ag_ok = b.recv(right, READY_AG, 0, f2, Desc::new("handshake", 1, 2, 0, 1));
    for t in 0..n - 1 {
        for k in 0..m {
            let desc = Desc::new("all-gather", t, n - 1, k, m);
            let id = (n - 1) * m + t * m + k;
            if let Some((off, len)) = piece(back(t), k) {
                let src = Loc::new(Buf::Recv, off, len);
                let w = b.write_remote(right, src, Remote::recv(off), imm(window, id), desc);
                b.dep(ag_ok, w);
            }
            if let Some((off, len)) = piece(back(t + 1), k) {
                b.landed(left, imm(window, id), Loc::new(Buf::Recv, off, len), desc);
            }
        }
    }
    Ok(Box::new(b.finish()))
}

/// A persistent put between this rank and `peer` (`put.rs`): each round
/// writes this rank's `src` elements `reps` times into the peer's `Recv`
/// (when `src > 0`), and waits for the peer's `dst` elements to land in
/// this rank's `Recv` `reps` times (when `dst > 0`). The target says
/// `Ready` (step 0) when its round starts, so that a round's writes never
/// reach it in the round before; nothing else is sent. A writer's round
/// ends when its writes complete, a target's when they have all landed.
pub fn put(
    peer: u32,
    src: usize,
    dst: usize,
    reps: usize,
    seg: usize,
    window: u8,
) -> Result<Box<dyn Schedule>> {
    let seg = seg.max(1);
    let chunks = |len: usize| nsegs(len, seg).max(1) * reps;
    let most = chunks(src).max(chunks(dst));
    if most > MAX_CHUNKS || reps == 0 {
        return Err(Error::InvalidArgument(format!(
            "a put of {reps} writes a round in pieces of {seg}: between 1 and {MAX_CHUNKS} writes a round, not {most}"
        )));
    }
    // Nothing is aliased: a put reads Send and writes Recv, never both.
    let mut b = Builder::new("one-sided put", Alias::NONE, 1);
    let mut flags = b.pool(2, 1);
    let (f0, f1) = (flags.slot(1), flags.slot(1));
    let sync = Desc::new("handshake", 0, 1, 0, 1);
    if dst > 0 {
        b.send(peer, READY_RS, 0, f0, sync);
        let m = nsegs(dst, seg);
        for rep in 0..reps {
            for k in 0..m {
                let (off, len) = segment(dst, seg, k).unwrap_or((0, 0));
                let desc = Desc::new("put", rep, reps, k, m);
                b.landed(
                    peer,
                    imm(window, rep * m + k),
                    Loc::new(Buf::Recv, off, len),
                    desc,
                );
            }
        }
    }
    if src > 0 {
        let ok = b.recv(peer, READY_RS, 0, f1, sync);
        let m = nsegs(src, seg);
        for rep in 0..reps {
            for k in 0..m {
                let (off, len) = segment(src, seg, k).unwrap_or((0, 0));
                let desc = Desc::new("put", rep, reps, k, m);
                let src = Loc::new(Buf::Send, off, len);
                let id = imm(window, rep * m + k);
                let w = b.write_remote(peer, src, Remote::recv(off), id, desc);
                b.dep(ok, w);
            }
        }
    }
    Ok(Box::new(b.finish()))
}

/// A persistent get between this rank and `peer` (`put.rs`), ib_read_bw's
/// operation: each round reads the peer's `Send` (`dst` elements) `reps`
/// times into this rank's `Recv` (when `dst > 0`), and lends this rank's
/// `Send` (`src` elements) to the peer's reads (when `src > 0`). The owner
/// of the bytes says `Ready` (step 0) when its round starts, so no read of
/// a round sees the bytes of the round before; the reader says `Done`
/// (step 1) once its reads completed, and the owner's round ends there,
/// so it may change its `Send` after it. Nothing else is sent: the bytes
/// move by reads ([`super::Action::Read`]) the owner takes no part in.
pub fn get(
    peer: u32,
    src: usize,
    dst: usize,
    reps: usize,
    seg: usize,
) -> Result<Box<dyn Schedule>> {
    let seg = seg.max(1);
    if reps == 0 {
        return Err(Error::InvalidArgument(
            "a get of 0 reads a round: at least 1".into(),
        ));
    }
    // Nothing is aliased: a get reads Send (the peer's) and writes Recv.
    let mut b = Builder::new("one-sided get", Alias::NONE, 1);
    let mut flags = b.pool(4, 1);
    let sync = Desc::new("handshake", 0, 1, 0, 1);
    // Each stream's steps in program order: both `Ready`s, then the reads
    // and both `Done`s.
    if src > 0 {
        b.send(peer, READY, 0, flags.slot(1), sync);
    }
    if dst > 0 {
        let ok = b.recv(peer, READY, 0, flags.slot(1), sync);
        let m = nsegs(dst, seg);
        let mut reads = Vec::with_capacity(reps * m);
        for rep in 0..reps {
            for k in 0..m {
                let (off, len) = segment(dst, seg, k).unwrap_or((0, 0));
                let desc = Desc::new("get", rep, reps, k, m);
                let at = Remote {
                    buf: Buf::Send,
                    offset: off,
                };
                let r = b.read_remote(peer, at, Loc::new(Buf::Recv, off, len), desc);
                b.dep(ok, r);
                reads.push(r);
            }
        }
        let done = b.send(peer, DONE, 0, flags.slot(1), sync);
        for r in reads {
            b.dep(r, done);
        }
    }
    if src > 0 {
        b.recv(peer, DONE, 0, flags.slot(1), sync);
    }
    Ok(Box::new(b.finish()))
}

/// The schedule over a simulated network in the style of `sim.rs`: every
/// rank's actions are carried out in a random interleaving, two-sided
/// messages and one-sided writes are delivered late and out of order, a
/// write reads its source only when it is delivered (as a NIC's DMA does,
/// any time before its completion), and completions of writes come after
/// their delivery, at random. Whatever the order, every rank must end with
/// the exact sum, round after round, in place and out of place.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Action, ActionId};
    use crate::op::OpKind;
    use gw_transport::rma::stamp_round;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    struct Mem {
        send: Vec<f64>,
        recv: Vec<f64>,
        window: Vec<f64>,
        scratch: Vec<f64>,
        in_place: bool,
    }

    impl Mem {
        fn buf(&mut self, b: Buf) -> &mut Vec<f64> {
            match b {
                Buf::Send if !self.in_place => &mut self.send,
                Buf::Send | Buf::Recv => &mut self.recv,
                Buf::Window => &mut self.window,
                Buf::Scratch => &mut self.scratch,
            }
        }
        fn read(&mut self, l: Loc) -> Vec<f64> {
            self.buf(l.buf)[l.offset..l.offset + l.len].to_vec()
        }
        fn write(&mut self, b: Buf, off: usize, v: &[f64]) {
            self.buf(b)[off..off + v.len()].copy_from_slice(v);
        }
    }

    enum Event {
        /// Rank `r` takes its next ready action.
        Act(usize),
        /// A two-sided message is delivered (index into `msgs`).
        Deliver(usize),
        /// A one-sided write lands (index into `writes`).
        Land(usize),
        /// A landed write completes at its writer.
        WriteDone(usize),
        /// A one-sided read fetches its bytes and completes (index into
        /// `reads`).
        Fetch(usize),
    }

    struct Rd {
        reader: usize,
        owner: usize,
        src: Remote,
        dst: Loc,
        id: ActionId,
        done: bool,
    }

    struct Msg {
        from: usize,
        to: usize,
        step: u32,
        data: Vec<f64>,
        send_id: ActionId,
        done: bool,
    }

    struct W {
        from: usize,
        to: usize,
        src: Loc,
        dst: Remote,
        imm: u32,
        id: ActionId,
        landed: bool,
        done: bool,
    }

    /// Where a rank's round is, for [`round`]'s hook.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Phase {
        /// It is about to take its first action.
        Start,
        /// Its schedule is done (the others' may still run).
        Done,
    }

    /// One round of every rank's schedule, in an order `rng` picks. `hook`
    /// runs with a rank's memory as its round starts and as it ends.
    fn round(
        scheds: &mut [Box<dyn Schedule>],
        mems: &mut [Mem],
        round: u8,
        rng: &mut StdRng,
        hook: &mut dyn FnMut(Phase, usize, &mut Mem),
    ) -> Result<(), String> {
        let n = scheds.len();
        let mut msgs: Vec<Msg> = Vec::new();
        // Posted receives: (rank, from, step, id, dst).
        let mut recvs: Vec<(usize, usize, u32, ActionId, Loc)> = Vec::new();
        let mut writes: Vec<W> = Vec::new();
        // Per rank: immediates landed and Landed actions waiting.
        let mut landed: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut waiting: Vec<Vec<(u32, ActionId)>> = vec![Vec::new(); n];
        let mut ready: Vec<Vec<Action>> = vec![Vec::new(); n];
        let mut reads: Vec<Rd> = Vec::new();
        let mut finished = vec![false; n];
        let mut started = vec![false; n];
        loop {
            for r in 0..n {
                while let Some(a) = scheds[r].next_action() {
                    ready[r].push(a);
                }
                if !finished[r] && scheds[r].is_done() {
                    finished[r] = true;
                    hook(Phase::Done, r, &mut mems[r]);
                }
            }
            let mut events = Vec::new();
            for (r, q) in ready.iter().enumerate() {
                if !q.is_empty() {
                    events.push(Event::Act(r));
                }
            }
            for (i, m) in msgs.iter().enumerate() {
                if !m.done
                    && recvs
                        .iter()
                        .any(|x| (x.0, x.1, x.2) == (m.to, m.from, m.step))
                {
                    events.push(Event::Deliver(i));
                }
            }
            for (i, w) in writes.iter().enumerate() {
                if !w.landed {
                    events.push(Event::Land(i));
                } else if !w.done {
                    events.push(Event::WriteDone(i));
                }
            }
            for (i, rd) in reads.iter().enumerate() {
                if !rd.done {
                    events.push(Event::Fetch(i));
                }
            }
            if events.is_empty() {
                break;
            }
            match events.swap_remove(rng.random_range(0..events.len())) {
                Event::Act(r) => {
                    if !started[r] {
                        started[r] = true;
                        hook(Phase::Start, r, &mut mems[r]);
                    }
                    let k = rng.random_range(0..ready[r].len());
                    let a = ready[r].swap_remove(k);
                    let m = &mut mems[r];
                    match a {
                        Action::Send {
                            id,
                            peer,
                            step,
                            src,
                        } => msgs.push(Msg {
                            from: r,
                            to: peer as usize,
                            step,
                            data: m.read(src),
                            send_id: id,
                            done: false,
                        }),
                        Action::Recv {
                            id,
                            peer,
                            step,
                            dst,
                        } => recvs.push((r, peer as usize, step, id, dst)),
                        Action::Reduce { id, dst, a, b, .. } => {
                            // Sums only: `finalize` matters for avg.
                            let (x, y) = (m.read(a), m.read(b));
                            let z: Vec<f64> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
                            m.write(dst.buf, dst.offset, &z);
                            scheds[r].complete(id);
                        }
                        Action::Copy { id, dst, src, .. } => {
                            let v = m.read(src);
                            m.write(dst.buf, dst.offset, &v);
                            scheds[r].complete(id);
                        }
                        Action::Write {
                            id,
                            peer,
                            src,
                            dst,
                            imm,
                        } => writes.push(W {
                            from: r,
                            to: peer as usize,
                            src,
                            dst,
                            imm: stamp_round(imm, round),
                            id,
                            landed: false,
                            done: false,
                        }),
                        Action::Read { id, peer, src, dst } => reads.push(Rd {
                            reader: r,
                            owner: peer as usize,
                            src,
                            dst,
                            id,
                            done: false,
                        }),
                        Action::Landed { id, peer, imm, .. } => {
                            let imm = stamp_round(imm, round);
                            if peer as usize == r {
                                return Err(format!("rank {r} waits for its own write"));
                            }
                            match landed[r].iter().position(|&v| v == imm) {
                                Some(i) => {
                                    landed[r].swap_remove(i);
                                    scheds[r].complete(id);
                                }
                                None => waiting[r].push((imm, id)),
                            }
                        }
                    }
                }
                Event::Deliver(i) => {
                    let m = &mut msgs[i];
                    let j = recvs
                        .iter()
                        .position(|x| (x.0, x.1, x.2) == (m.to, m.from, m.step))
                        .ok_or("no receive")?;
                    let (to, _, _, rid, dst) = recvs.swap_remove(j);
                    if dst.len != m.data.len() {
                        return Err(format!("message of {} into {dst:?}", m.data.len()));
                    }
                    mems[to].write(dst.buf, dst.offset, &m.data);
                    m.done = true;
                    scheds[to].complete(rid);
                    scheds[m.from].complete(m.send_id);
                }
                Event::Land(i) => {
                    let w = &mut writes[i];
                    // The source is read now, late, as DMA may.
                    let data = mems[w.from].read(w.src);
                    mems[w.to].write(w.dst.buf, w.dst.offset, &data);
                    w.landed = true;
                    let to = w.to;
                    match waiting[to].iter().position(|&(v, _)| v == w.imm) {
                        Some(k) => {
                            let (_, id) = waiting[to].swap_remove(k);
                            scheds[to].complete(id);
                        }
                        None => landed[to].push(w.imm),
                    }
                }
                Event::WriteDone(i) => {
                    writes[i].done = true;
                    scheds[writes[i].from].complete(writes[i].id);
                }
                Event::Fetch(i) => {
                    let rd = &mut reads[i];
                    // The owner's bytes as they are now, late, as a NIC's
                    // read may see them.
                    let at = Loc::new(rd.src.buf, rd.src.offset, rd.dst.len);
                    let data = mems[rd.owner].read(at);
                    mems[rd.reader].write(rd.dst.buf, rd.dst.offset, &data);
                    rd.done = true;
                    scheds[rd.reader].complete(rd.id);
                }
            }
        }
        for (r, s) in scheds.iter().enumerate() {
            if !s.is_done() {
                return Err(format!("rank {r} stuck: {}", s.waiting_for()));
            }
            if !landed[r].is_empty() {
                return Err(format!(
                    "rank {r}: immediates nobody waited for: {:?}",
                    landed[r]
                ));
            }
        }
        Ok(())
    }

    /// The all-reduce of `count` elements on rank `rank` of `n`.
    fn spec(rank: usize, n: usize, count: usize, seg: usize) -> OpSpec {
        OpSpec {
            op: OpKind::AllReduce,
            rank: rank as u32,
            nranks: n as u32,
            count,
            root: 0,
            segment_elems: seg,
            depth: 1,
            scaled: false,
            local_size: 1,
            fan_out: false,
        }
    }

    fn run(n: usize, count: usize, seg: usize, in_place: bool, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut scheds = Vec::new();
        let mut mems = Vec::new();
        for r in 0..n {
            let s = allreduce(&spec(r, n, count, seg), seg, 3).map_err(|e| e.to_string())?;
            mems.push(Mem {
                send: vec![0.0; count],
                recv: vec![0.0; count],
                window: vec![f64::NAN; s.window_elems()],
                scratch: vec![0.0; s.scratch_elems()],
                in_place,
            });
            scheds.push(s);
        }
        for k in 0..4u8 {
            for (r, m) in mems.iter_mut().enumerate() {
                let input: Vec<f64> = (0..count)
                    .map(|i| ((r + 1) * 1000 + i + k as usize) as f64)
                    .collect();
                m.buf(Buf::Send).copy_from_slice(&input);
                if !in_place {
                    m.recv.fill(f64::NAN);
                }
            }
            for s in scheds.iter_mut() {
                assert!(s.reset());
            }
            round(
                &mut scheds,
                &mut mems,
                k.wrapping_add(1),
                &mut rng,
                &mut |_, _, _| {},
            )
            .map_err(|e| format!("round {k}: {e}"))?;
            for (r, m) in mems.iter().enumerate() {
                for i in 0..count {
                    let want: f64 = (0..n)
                        .map(|q| ((q + 1) * 1000 + i + k as usize) as f64)
                        .sum();
                    if m.recv[i] != want {
                        return Err(format!(
                            "round {k}: rank {r} element {i} is {} not {want}",
                            m.recv[i]
                        ));
                    }
                }
                if !in_place {
                    let mine = ((r + 1) * 1000 + k as usize) as f64;
                    if m.send[0] != mine {
                        return Err(format!("round {k}: rank {r}'s send buffer was written"));
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn every_interleaving_sums_exactly() {
        for n in [2, 3, 4, 5, 8] {
            for (count, seg) in [(1, 1), (7, 2), (n - 1, 1), (100, 7), (1000, 64)] {
                for in_place in [false, true] {
                    for seed in 0..20 {
                        if let Err(e) = run(n, count, seg, in_place, seed) {
                            panic!(
                                "n {n} count {count} seg {seg} in place {in_place} seed {seed}: {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_round_costs_two_messages_per_neighbour_whatever_the_size() {
        for (count, seg) in [(16, 4), (1 << 20, 1 << 10)] {
            let mut s = allreduce(&spec(1, 4, count, seg), seg, 0).unwrap();
            let (mut sends, mut writes) = (0, 0);
            while let Some(a) = s.next_action() {
                match a {
                    Action::Send { peer, .. } => {
                        assert_eq!(peer, 0, "Ready goes to the left neighbour");
                        sends += 1;
                    }
                    Action::Write { peer, .. } => {
                        assert_eq!(peer, 2, "data goes to the right neighbour");
                        writes += 1;
                    }
                    _ => {}
                }
                s.complete(a.id());
            }
            assert_eq!(sends, 2, "count {count}");
            let m = (count / 4).div_ceil(seg);
            assert_eq!(writes, 2 * 3 * m, "count {count}");
        }
    }

    /// A get's rounds over the simulated network: reads fetch late, in any
    /// order; each owner puts the round's bytes in its send buffer only as
    /// its round starts, and overwrites them the moment its round ends. A
    /// reader must still find exactly the round's bytes: a read before the
    /// owner's `Ready`, or an owner whose round ended before the reads (no
    /// `Done`), shows as the wrong bytes.
    fn run_get(len: usize, seg: usize, reps: usize, bidir: bool, seed: u64) -> Result<(), String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let value = |r: usize, k: u8, i: usize| (r * 1_000_000 + k as usize * 1000 + i) as f64;
        let (mut scheds, mut mems) = (Vec::new(), Vec::new());
        for r in 0..2 {
            let lends = r == 0 || bidir;
            let reads = r == 1 || bidir;
            let (src, dst) = (if lends { len } else { 0 }, if reads { len } else { 0 });
            let s = get(1 - r as u32, src, dst, reps, seg).map_err(|e| e.to_string())?;
            mems.push(Mem {
                send: vec![0.0; src],
                recv: vec![0.0; dst],
                window: Vec::new(),
                scratch: vec![0.0; s.scratch_elems()],
                in_place: false,
            });
            scheds.push(s);
        }
        for k in 0..4u8 {
            for m in mems.iter_mut() {
                m.send.fill(-2.0);
                m.recv.fill(f64::NAN);
            }
            for s in scheds.iter_mut() {
                assert!(s.reset());
            }
            let mut owner = |p: Phase, r: usize, m: &mut Mem| match p {
                Phase::Start => {
                    for (i, v) in m.send.iter_mut().enumerate() {
                        *v = value(r, k, i);
                    }
                }
                Phase::Done => m.send.fill(-1.0),
            };
            round(&mut scheds, &mut mems, k, &mut rng, &mut owner)
                .map_err(|e| format!("round {k}: {e}"))?;
            for (r, m) in mems.iter().enumerate() {
                if let Some(i) = (0..m.recv.len()).find(|&i| m.recv[i] != value(1 - r, k, i)) {
                    return Err(format!(
                        "round {k}: rank {r} read {} at {i}, not {}",
                        m.recv[i],
                        value(1 - r, k, i)
                    ));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn a_get_reads_exactly_the_owners_round_in_every_interleaving() {
        for (len, seg, reps) in [(1, 1, 1), (10, 3, 2), (64, 64, 3)] {
            for bidir in [false, true] {
                for seed in 0..200 {
                    if let Err(e) = run_get(len, seg, reps, bidir, seed) {
                        panic!("len {len} seg {seg} reps {reps} bidir {bidir} seed {seed}: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_get_sends_two_messages_a_round_whatever_the_size() {
        for (len, seg) in [(16, 4), (1 << 20, 1 << 10)] {
            let mut s = get(0, len, len, 2, seg).unwrap();
            let (mut msgs, mut reads) = (0, 0);
            while let Some(a) = s.next_action() {
                match a {
                    Action::Send { .. } | Action::Recv { .. } => msgs += 1,
                    Action::Read { peer, .. } => {
                        assert_eq!(peer, 0);
                        reads += 1;
                    }
                    other => panic!("a get does {other:?}"),
                }
                s.complete(a.id());
            }
            // Ready and Done each way.
            assert_eq!(msgs, 4, "len {len}");
            assert_eq!(reads, 2 * len.div_ceil(seg), "len {len}");
        }
        assert!(get(0, 8, 8, 0, 4).is_err());
    }

    #[test]
    fn too_many_chunks_is_refused_so_the_caller_falls_back() {
        let spec = spec(0, 8, 1 << 30, 1);
        let e = allreduce(&spec, 1024, 0).err().unwrap().to_string();
        assert!(e.contains("chunks"), "{e}");
        let one = OpSpec { nranks: 1, ..spec };
        assert!(allreduce(&one, 1024, 0).is_err());
    }
}
