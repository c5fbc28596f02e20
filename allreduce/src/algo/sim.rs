//! A simulated network that runs the schedules of all ranks of a collective
//! together over real data, in a random order, and checks them.
//!
//! Every rank has `Send`, `Recv` and `Scratch` buffers of "elements" that are
//! four `f64` lanes, so one run checks four reductions at once: lane 0 sum,
//! lane 1 weighted sum (the driver's weight applies to it when the schedule is
//! scaled), lane 2 average (sum, divided by `n` where `finalize` is set) and
//! lane 3 max. Data are small integers and weights dyadic, so every sum is
//! exact and results are compared bit for bit against a sequential reference.
//!
//! The driver repeatedly picks a random event: ask a random rank for its next
//! action (reductions and copies run at once), deliver a message whose
//! receive is posted (matched by source, destination and step), or complete a
//! send (after its delivery, or, with probability `eager`, before it, the
//! data then being buffered at that moment). It fails on: an access out of a
//! buffer's bounds, a write to `Send`, a reduction whose destination partly
//! overlaps a source, reading memory that a posted receive may still write or
//! writing memory that a send or receive in flight still uses, two sends or
//! two receives with the same (peer, step), a message whose length differs
//! from the receive posted for it, a send straight from `Send` in a scaled
//! schedule, a schedule that is done with actions in flight or that hands out
//! an action id twice, messages left over, and deadlock (no event possible
//! while a schedule is not done). It counts `finalize` applications per
//! element.

use std::collections::{HashMap, HashSet};

use gw_transport::wire::OpKind;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Action, ActionId, Algo, Buf, Loc, OpSpec, Schedule, build};

/// One element: sum, weighted sum, average, max.
type V = [f64; 4];
const WSUM: usize = 1;
const AVG: usize = 2;
const MAX: usize = 3;
const NAN4: V = [f64::NAN; 4];

#[derive(Clone, Copy, Debug)]
struct Case {
    op: OpKind,
    algo: Algo,
    n: usize,
    count: usize,
    seg: usize,
    root: usize,
    in_place: bool,
    scaled: bool,
    /// Probability that a send completes before its message is delivered.
    eager: f64,
    seed: u64,
}

impl Case {
    fn spec(&self, rank: usize) -> OpSpec {
        OpSpec {
            op: self.op,
            rank: rank as u32,
            nranks: self.n as u32,
            count: self.count,
            root: self.root as u32,
            segment_elems: self.seg,
            scaled: self.scaled,
        }
    }

    /// Lengths of `Send` and `Recv`.
    fn lens(&self) -> (usize, usize) {
        let (n, c) = (self.n, self.count);
        match self.op {
            OpKind::ReduceScatter => (n * c, c),
            OpKind::AllGather => (c, n * c),
            OpKind::Barrier | OpKind::SendRecv => (0, 0),
            _ => (c, c),
        }
    }

    fn is_reduction(&self) -> bool {
        matches!(
            self.op,
            OpKind::AllReduce | OpKind::ReduceScatter | OpKind::Reduce
        )
    }
}

/// A buffer as a window of one of a rank's stores.
#[derive(Clone, Copy, Debug)]
struct View {
    store: usize,
    base: usize,
    len: usize,
}

/// Memory a send or receive in flight uses.
struct Region {
    store: usize,
    start: usize,
    end: usize,
    write: bool,
    id: ActionId,
}

struct RankSim {
    sched: Box<dyn Schedule>,
    /// 0: Send (and, in place, Recv), 1: Recv out of place, 2: Scratch.
    stores: [Vec<V>; 3],
    finalized: [Vec<u32>; 3],
    send: View,
    recv: View,
    scratch: View,
    weight: f64,
    inflight: Vec<Region>,
    issued: HashSet<ActionId>,
    pollable: bool,
    entered: bool,
}

impl RankSim {
    fn view(&self, b: Buf) -> View {
        match b {
            Buf::Send => self.send,
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
        }
    }

    /// `(store, start, end)` of `loc`, bounds-checked.
    fn resolve(&self, loc: Loc) -> Result<(usize, usize, usize), String> {
        let v = self.view(loc.buf);
        match loc.offset.checked_add(loc.len) {
            Some(end) if end <= v.len => Ok((v.store, v.base + loc.offset, v.base + end)),
            _ => Err(format!(
                "{loc:?} out of bounds of {:?} ({} elements)",
                loc.buf, v.len
            )),
        }
    }

    /// Fails if `[start, end)` of `store` conflicts with a transfer in flight.
    fn hazard(
        &self,
        (store, start, end): (usize, usize, usize),
        write: bool,
        me: ActionId,
    ) -> Result<(), String> {
        for r in &self.inflight {
            if r.id != me
                && r.store == store
                && start < r.end
                && r.start < end
                && (write || r.write)
            {
                return Err(format!(
                    "{} elements {start}..{end} of store {store} while action {} ({} {}..{}) is in flight on them",
                    if write { "writes" } else { "reads" },
                    r.id,
                    if r.write { "recv into" } else { "send from" },
                    r.start,
                    r.end
                ));
            }
        }
        Ok(())
    }

    /// Reads `loc`; `Send` is scaled by the weight (lane 1) when `scaled`.
    fn read(&self, loc: Loc, scaled: bool) -> Result<Vec<V>, String> {
        let (s, a, b) = self.resolve(loc)?;
        let mut out = self.stores[s][a..b].to_vec();
        if scaled && loc.buf == Buf::Send {
            for v in &mut out {
                v[WSUM] *= self.weight;
            }
        }
        Ok(out)
    }

    fn write(&mut self, loc: Loc, data: &[V], finalize: bool) -> Result<(), String> {
        if loc.buf == Buf::Send {
            return Err(format!("writes to Send: {loc:?}"));
        }
        let (s, a, b) = self.resolve(loc)?;
        self.stores[s][a..b].copy_from_slice(data);
        if finalize {
            for f in &mut self.finalized[s][a..b] {
                *f += 1;
            }
        }
        Ok(())
    }

    fn untrack(&mut self, id: ActionId) {
        self.inflight.retain(|r| r.id != id);
    }
}

struct Msg {
    src: usize,
    dst: usize,
    step: u32,
    send_id: ActionId,
    loc: Loc,
    data: Option<Vec<V>>,
    recv: Option<(ActionId, Loc)>,
    delivered: bool,
    completion_queued: bool,
    send_done: bool,
}

/// What a run leaves behind, per rank.
struct Outcome {
    /// Raw (unscaled) `Send` contents before the call.
    inputs: Vec<Vec<f64>>,
    weights: Vec<f64>,
    recv_before: Vec<Vec<V>>,
    recv: Vec<Vec<V>>,
    /// Finalize applications per `Recv` element, and in all of a rank's memory.
    fin_recv: Vec<Vec<u32>>,
    fin_total: Vec<u32>,
}

type Make<'a> = &'a dyn Fn(&OpSpec) -> Result<Box<dyn Schedule>, String>;

const WEIGHTS: [f64; 6] = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0];

struct Sim<'c> {
    case: &'c Case,
    ranks: Vec<RankSim>,
    msgs: Vec<Msg>,
    sends: HashMap<(usize, usize, u32), usize>,
    recv_keys: HashSet<(usize, usize, u32)>,
    recvs_waiting: HashMap<(usize, usize, u32), (ActionId, Loc)>,
    deliverable: Vec<usize>,
    completable: Vec<usize>,
    rng: StdRng,
}

impl Sim<'_> {
    fn poll(&mut self, r: usize) -> Result<(), String> {
        let rank = &mut self.ranks[r];
        rank.entered = true;
        let Some(action) = rank.sched.next_action() else {
            rank.pollable = false;
            return Ok(());
        };
        if !rank.issued.insert(action.id()) {
            return Err(format!(
                "rank {r}: action id {} handed out twice: {action:?}",
                action.id()
            ));
        }
        self.act(r, action)
            .map_err(|e| format!("rank {r}: {action:?}: {e}"))
    }

    fn act(&mut self, r: usize, action: Action) -> Result<(), String> {
        let (n, scaled) = (self.case.n, self.case.scaled);
        let peer_ok = |p: u32| (p as usize) < n && p as usize != r;
        match action {
            Action::Send {
                id,
                peer,
                step,
                src,
            } => {
                if !peer_ok(peer) {
                    return Err("bad peer".into());
                }
                if scaled && src.buf == Buf::Send {
                    return Err("sends straight from Send in a scaled schedule".into());
                }
                let rank = &mut self.ranks[r];
                let (s, a, b) = rank.resolve(src)?;
                rank.hazard((s, a, b), false, id)?;
                rank.inflight.push(Region {
                    store: s,
                    start: a,
                    end: b,
                    write: false,
                    id,
                });
                let key = (r, peer as usize, step);
                if self.sends.contains_key(&key) {
                    return Err(format!("second send to rank {peer} with step {step}"));
                }
                let idx = self.msgs.len();
                self.sends.insert(key, idx);
                let recv = self.recvs_waiting.remove(&key);
                if recv.is_some() {
                    self.deliverable.push(idx);
                }
                let eager = self.rng.random_bool(self.case.eager);
                if eager {
                    self.completable.push(idx);
                }
                self.msgs.push(Msg {
                    src: r,
                    dst: peer as usize,
                    step,
                    send_id: id,
                    loc: src,
                    data: None,
                    recv,
                    delivered: false,
                    completion_queued: eager,
                    send_done: false,
                });
            }
            Action::Recv {
                id,
                peer,
                step,
                dst,
            } => {
                if !peer_ok(peer) {
                    return Err("bad peer".into());
                }
                if dst.buf == Buf::Send {
                    return Err("receives into Send".into());
                }
                let rank = &mut self.ranks[r];
                let (s, a, b) = rank.resolve(dst)?;
                rank.hazard((s, a, b), true, id)?;
                rank.inflight.push(Region {
                    store: s,
                    start: a,
                    end: b,
                    write: true,
                    id,
                });
                let key = (peer as usize, r, step);
                if !self.recv_keys.insert(key) {
                    return Err(format!(
                        "two recvs with the same (peer, step) = ({peer}, {step})"
                    ));
                }
                match self.sends.get(&key) {
                    Some(&idx) => {
                        self.msgs[idx].recv = Some((id, dst));
                        self.deliverable.push(idx);
                    }
                    None => {
                        self.recvs_waiting.insert(key, (id, dst));
                    }
                }
            }
            Action::Reduce {
                id,
                dst,
                a,
                b,
                finalize,
            } => {
                if dst.len != a.len || dst.len != b.len {
                    return Err("length mismatch".into());
                }
                let rank = &mut self.ranks[r];
                let (rd, ra, rb) = (rank.resolve(dst)?, rank.resolve(a)?, rank.resolve(b)?);
                for src in [ra, rb] {
                    let overlap = src.0 == rd.0 && src.1 < rd.2 && rd.1 < src.2;
                    if overlap && src != rd {
                        return Err("destination partly overlaps a source".into());
                    }
                    rank.hazard(src, false, id)?;
                }
                rank.hazard(rd, true, id)?;
                let (va, vb) = (rank.read(a, scaled)?, rank.read(b, scaled)?);
                let out: Vec<V> = va
                    .iter()
                    .zip(&vb)
                    .map(|(x, y)| {
                        let mut z = [x[0] + y[0], x[1] + y[1], x[2] + y[2], x[MAX].max(y[MAX])];
                        if finalize {
                            z[AVG] /= n as f64;
                        }
                        z
                    })
                    .collect();
                rank.write(dst, &out, finalize)?;
                self.finish(r, id)?;
            }
            Action::Copy {
                id,
                dst,
                src,
                finalize,
            } => {
                if dst.len != src.len {
                    return Err("length mismatch".into());
                }
                let rank = &mut self.ranks[r];
                let (rd, rs) = (rank.resolve(dst)?, rank.resolve(src)?);
                if rd.0 == rs.0 && rs.1 < rd.2 && rd.1 < rs.2 && rd != rs {
                    return Err("destination partly overlaps the source".into());
                }
                rank.hazard(rs, false, id)?;
                rank.hazard(rd, true, id)?;
                let mut out = rank.read(src, scaled)?;
                if finalize {
                    for v in &mut out {
                        v[AVG] /= n as f64;
                    }
                }
                rank.write(dst, &out, finalize)?;
                self.finish(r, id)?;
            }
        }
        Ok(())
    }

    /// Tells rank `r`'s schedule that `id` completed.
    fn finish(&mut self, r: usize, id: ActionId) -> Result<(), String> {
        let rank = &mut self.ranks[r];
        rank.untrack(id);
        rank.sched.complete(id);
        rank.pollable = true;
        if rank.sched.is_done() {
            if !rank.inflight.is_empty() {
                return Err(format!(
                    "rank {r} is done with {} transfers in flight",
                    rank.inflight.len()
                ));
            }
            if self.case.op == OpKind::Barrier && !self.ranks.iter().all(|x| x.entered) {
                return Err(format!(
                    "rank {r} left the barrier before every rank entered it"
                ));
            }
        }
        Ok(())
    }

    fn deliver(&mut self, idx: usize) -> Result<(), String> {
        let m = &self.msgs[idx];
        let (rid, dst) = m.recv.expect("deliverable message has a receive");
        let what = || format!("message rank {} -> rank {} step {}", m.src, m.dst, m.step);
        if m.loc.len != dst.len {
            return Err(format!(
                "{}: {} elements sent, recv posted for {}",
                what(),
                m.loc.len,
                dst.len
            ));
        }
        let data = match &m.data {
            Some(d) => d.clone(),
            None => self.ranks[m.src].read(m.loc, self.case.scaled)?,
        };
        let dst_rank = m.dst;
        self.ranks[dst_rank]
            .write(dst, &data, false)
            .map_err(|e| format!("{}: {e}", what()))?;
        let m = &mut self.msgs[idx];
        m.delivered = true;
        if !m.completion_queued {
            m.completion_queued = true;
            self.completable.push(idx);
        }
        self.finish(dst_rank, rid)
    }

    fn complete_send(&mut self, idx: usize) -> Result<(), String> {
        let m = &self.msgs[idx];
        if !m.delivered {
            let data = self.ranks[m.src].read(m.loc, self.case.scaled)?;
            self.msgs[idx].data = Some(data);
        }
        let m = &mut self.msgs[idx];
        m.send_done = true;
        let (src, id) = (m.src, m.send_id);
        self.finish(src, id)
    }

    fn describe(&self) -> String {
        let mut s = String::new();
        for (r, rank) in self.ranks.iter().enumerate() {
            s += &format!("\n  rank {r}: {}", rank.sched.waiting_for());
        }
        for m in self.msgs.iter().filter(|m| !m.delivered) {
            s += &format!(
                "\n  undelivered: rank {} -> {} step {}",
                m.src, m.dst, m.step
            );
        }
        for (k, _) in &self.recvs_waiting {
            s += &format!("\n  unmatched recv: rank {} <- {} step {}", k.1, k.0, k.2);
        }
        s
    }
}

/// Runs `case` with schedules from `make`.
fn run_with(case: &Case, make: Make) -> Result<Outcome, String> {
    let mut rng = StdRng::seed_from_u64(case.seed);
    let (send_len, recv_len) = case.lens();
    let n = case.n;
    let mut ranks = Vec::with_capacity(n);
    let mut inputs = Vec::with_capacity(n);
    let mut weights = Vec::with_capacity(n);
    for r in 0..n {
        let sched = make(&case.spec(r))?;
        let scratch_len = sched.scratch_elems();
        let input: Vec<f64> = (0..send_len)
            .map(|_| rng.random_range(-20i32..=20) as f64)
            .collect();
        let weight = WEIGHTS[rng.random_range(0..WEIGHTS.len())];
        let meaningful = case.op != OpKind::Broadcast || r == case.root;
        let (stores, send, recv) = if case.in_place {
            let (off_send, off_recv, len) = match case.op {
                OpKind::ReduceScatter => (0, r * case.count, send_len),
                OpKind::AllGather => (r * case.count, 0, recv_len),
                _ => (0, 0, send_len),
            };
            let mut user = vec![NAN4; len];
            if meaningful {
                for (i, &x) in input.iter().enumerate() {
                    user[off_send + i] = [x; 4];
                }
            }
            let send = View {
                store: 0,
                base: off_send,
                len: send_len,
            };
            let recv = View {
                store: 0,
                base: off_recv,
                len: recv_len,
            };
            ([user, Vec::new(), vec![NAN4; scratch_len]], send, recv)
        } else {
            let user: Vec<V> = if meaningful {
                input.iter().map(|&x| [x; 4]).collect()
            } else {
                vec![NAN4; send_len]
            };
            let send = View {
                store: 0,
                base: 0,
                len: send_len,
            };
            let recv = View {
                store: 1,
                base: 0,
                len: recv_len,
            };
            (
                [user, vec![NAN4; recv_len], vec![NAN4; scratch_len]],
                send,
                recv,
            )
        };
        let finalized = [
            vec![0; stores[0].len()],
            vec![0; stores[1].len()],
            vec![0; stores[2].len()],
        ];
        let scratch = View {
            store: 2,
            base: 0,
            len: scratch_len,
        };
        ranks.push(RankSim {
            sched,
            stores,
            finalized,
            send,
            recv,
            scratch,
            weight,
            inflight: Vec::new(),
            issued: HashSet::new(),
            pollable: true,
            entered: false,
        });
        inputs.push(input);
        weights.push(weight);
    }
    let recv_before = ranks
        .iter()
        .map(|x| x.stores[x.recv.store][x.recv.base..][..x.recv.len].to_vec())
        .collect();
    // How much each kind of event is favoured, per run.
    let bias = [
        rng.random_range(1..8u32),
        rng.random_range(1..8u32),
        rng.random_range(1..8u32),
    ];
    let mut sim = Sim {
        case,
        ranks,
        msgs: Vec::new(),
        sends: HashMap::new(),
        recv_keys: HashSet::new(),
        recvs_waiting: HashMap::new(),
        deliverable: Vec::new(),
        completable: Vec::new(),
        rng,
    };
    let mut pollable = Vec::with_capacity(n);
    for _events in 0..50_000_000u64 {
        pollable.clear();
        pollable.extend((0..n).filter(|&r| sim.ranks[r].pollable));
        let sizes = [pollable.len(), sim.deliverable.len(), sim.completable.len()];
        let total: u32 = (0..3).filter(|&k| sizes[k] > 0).map(|k| bias[k]).sum();
        if total == 0 {
            break;
        }
        let mut pick = sim.rng.random_range(0..total);
        let kind = (0..3).find(|&k| {
            if sizes[k] == 0 {
                return false;
            }
            if pick < bias[k] {
                return true;
            }
            pick -= bias[k];
            false
        });
        let i = sim.rng.random_range(0..sizes[kind.expect("an event")]);
        match kind {
            Some(0) => sim.poll(pollable[i])?,
            Some(1) => {
                let idx = sim.deliverable.swap_remove(i);
                sim.deliver(idx)?;
            }
            _ => {
                let idx = sim.completable.swap_remove(i);
                sim.complete_send(idx)?;
            }
        }
    }
    if !sim.ranks.iter().all(|x| x.sched.is_done()) {
        return Err(format!("deadlock: no event possible{}", sim.describe()));
    }
    if sim.msgs.iter().any(|m| !m.delivered || !m.send_done) || !sim.recvs_waiting.is_empty() {
        return Err(format!("messages left over{}", sim.describe()));
    }
    for (r, rank) in sim.ranks.iter_mut().enumerate() {
        if let Some(a) = rank.sched.next_action() {
            return Err(format!("rank {r}: done schedule hands out {a:?}"));
        }
    }
    Ok(Outcome {
        inputs,
        weights,
        recv_before,
        recv: sim
            .ranks
            .iter()
            .map(|x| x.stores[x.recv.store][x.recv.base..][..x.recv.len].to_vec())
            .collect(),
        fin_recv: sim
            .ranks
            .iter()
            .map(|x| x.finalized[x.recv.store][x.recv.base..][..x.recv.len].to_vec())
            .collect(),
        fin_total: sim
            .ranks
            .iter()
            .map(|x| x.finalized.iter().flatten().sum())
            .collect(),
    })
}

fn make_built(algo: Algo) -> impl Fn(&OpSpec) -> Result<Box<dyn Schedule>, String> {
    move |spec| build(spec, algo).map_err(|e| e.to_string())
}

/// Compares an outcome with the sequential reference.
fn check(case: &Case, o: &Outcome) -> Result<(), String> {
    let (n, count) = (case.n, case.count);
    let contrib = |q: usize, i: usize| -> V {
        let x = o.inputs[q][i];
        [x, if case.scaled { x * o.weights[q] } else { x }, x, x]
    };
    let reduced = |i: usize| -> V {
        let mut acc = contrib(0, i);
        for q in 1..n {
            let c = contrib(q, i);
            for l in 0..3 {
                acc[l] += c[l];
            }
            acc[MAX] = acc[MAX].max(c[MAX]);
        }
        acc[AVG] /= n as f64;
        acc
    };
    let same = |a: &V, b: &V| {
        a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
    };
    let expect = |r: usize, want: &dyn Fn(usize) -> V| -> Result<(), String> {
        for (i, got) in o.recv[r].iter().enumerate() {
            let w = want(i);
            if !same(got, &w) {
                return Err(format!("rank {r} Recv[{i}] = {got:?}, expected {w:?}"));
            }
        }
        Ok(())
    };
    let total: u32 = o.fin_total.iter().sum();
    let fin_err = |what: String| {
        Err(format!(
            "finalize: {what} (applied {:?} times per rank)",
            o.fin_total
        ))
    };
    match case.op {
        OpKind::AllReduce => {
            for r in 0..n {
                expect(r, &reduced)?;
            }
            for i in 0..count {
                let k: u32 = (0..n).map(|r| o.fin_recv[r][i]).sum();
                if k != 1 {
                    return fin_err(format!("element {i} finalized {k} times over all ranks"));
                }
            }
            if total as usize != count {
                return fin_err(format!("{total} applications for {count} elements"));
            }
        }
        OpKind::ReduceScatter => {
            for r in 0..n {
                expect(r, &|i| reduced(r * count + i))?;
                if o.fin_recv[r].iter().any(|&k| k != 1) || o.fin_total[r] as usize != count {
                    return fin_err(format!("rank {r}: {:?}", o.fin_recv[r]));
                }
            }
        }
        OpKind::Reduce => {
            for r in 0..n {
                if r == case.root {
                    expect(r, &reduced)?;
                } else {
                    expect(r, &|i| o.recv_before[r][i])?;
                }
            }
            if o.fin_recv[case.root].iter().any(|&k| k != 1) || total as usize != count {
                return fin_err(format!("root: {:?}", o.fin_recv[case.root]));
            }
        }
        OpKind::AllGather => {
            for r in 0..n {
                expect(r, &|i| contrib(i / count.max(1), i % count.max(1)))?;
            }
        }
        OpKind::Broadcast => {
            for r in 0..n {
                expect(r, &|i| contrib(case.root, i))?;
            }
        }
        OpKind::Barrier | OpKind::SendRecv => {}
    }
    if !case.is_reduction() && total != 0 {
        return fin_err("applied in an operation without reduction".into());
    }
    Ok(())
}

fn run_case(case: &Case) -> Result<(), String> {
    let o = run_with(case, &make_built(case.algo))?;
    check(case, &o)
}

const OPS: [(OpKind, Algo); 8] = [
    (OpKind::AllReduce, Algo::Ring),
    (OpKind::AllReduce, Algo::Tree),
    (OpKind::AllReduce, Algo::Rhd),
    (OpKind::ReduceScatter, Algo::Ring),
    (OpKind::AllGather, Algo::Ring),
    (OpKind::Broadcast, Algo::Ring),
    (OpKind::Reduce, Algo::Ring),
    (OpKind::Barrier, Algo::Ring),
];

/// Every n in 1..=9 × counts × segment sizes × {out of place, in place} ×
/// {unscaled, scaled}, each with its own delivery order; half the runs
/// complete sends only once delivered (rendezvous), half mostly eagerly.
fn matrix(op: OpKind, algo: Algo, counts: &[usize]) {
    let mut runs = 0;
    for n in 1..=9usize {
        if algo == Algo::Rhd && op == OpKind::AllReduce && !n.is_power_of_two() {
            let spec = Case {
                op,
                algo,
                n,
                count: 10,
                seg: 4,
                root: 0,
                in_place: false,
                scaled: false,
                eager: 0.0,
                seed: 0,
            }
            .spec(0);
            let err = build(&spec, algo)
                .err()
                .expect("rhd on a non-power-of-two world size");
            assert_eq!(
                err.to_string(),
                format!("invalid argument: rhd needs a power-of-two world size, got {n} ranks")
            );
            continue;
        }
        for &count in counts {
            for seg in [1, 3, 64, usize::MAX] {
                for (v, (in_place, scaled)) in
                    [(false, false), (true, false), (false, true), (true, true)]
                        .into_iter()
                        .enumerate()
                {
                    let seed = (n as u64) << 40
                        ^ (count as u64) << 20
                        ^ (seg as u64 % 1000) << 4
                        ^ v as u64;
                    let case = Case {
                        op,
                        algo,
                        n,
                        count,
                        seg,
                        root: (count + v + seg % 7) % n,
                        in_place,
                        scaled,
                        eager: if in_place == scaled { 0.0 } else { 0.8 },
                        seed,
                    };
                    if let Err(e) = run_case(&case) {
                        panic!("{case:?}: {e}");
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 0);
}

const COUNTS: [usize; 7] = [0, 1, 7, 1000, 13, 100, 389];

#[test]
fn ring_allreduce() {
    matrix(OpKind::AllReduce, Algo::Ring, &COUNTS);
}

#[test]
fn tree_allreduce() {
    matrix(OpKind::AllReduce, Algo::Tree, &COUNTS);
}

#[test]
fn rhd_allreduce() {
    matrix(OpKind::AllReduce, Algo::Rhd, &COUNTS);
}

#[test]
fn ring_reduce_scatter() {
    matrix(OpKind::ReduceScatter, Algo::Ring, &COUNTS);
}

#[test]
fn ring_all_gather() {
    matrix(OpKind::AllGather, Algo::Ring, &COUNTS);
}

#[test]
fn broadcast() {
    matrix(OpKind::Broadcast, Algo::Ring, &COUNTS);
}

#[test]
fn reduce() {
    matrix(OpKind::Reduce, Algo::Ring, &COUNTS);
}

#[test]
fn barrier() {
    matrix(OpKind::Barrier, Algo::Ring, &[0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random operation, world size, count, segment size, layout, scaling,
    /// delivery order and eagerness.
    #[test]
    fn random_cases(
        which in 0..OPS.len(),
        n in 1usize..=12,
        count in prop_oneof![0usize..40, 0usize..400],
        seg in prop_oneof![1usize..8, 1usize..100, Just(usize::MAX)],
        root in 0usize..12,
        in_place: bool,
        scaled: bool,
        eager in prop_oneof![Just(0.0), 0.0f64..1.0],
        seed: u64,
    ) {
        let (op, algo) = OPS[which];
        let count = if op == OpKind::Barrier { 0 } else { count };
        let case = Case { op, algo, n, count, seg, root: root % n, in_place, scaled, eager, seed };
        if algo == Algo::Rhd && op == OpKind::AllReduce && !n.is_power_of_two() {
            prop_assert!(build(&case.spec(0), algo).is_err());
        } else {
            let r = run_case(&case);
            prop_assert!(r.is_ok(), "{:?}: {}", case, r.unwrap_err());
        }
    }
}
