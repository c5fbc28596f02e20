//! The one-sided protocol against simulated links: every message, control
//! message and completion is held in flight and delivered in a random order,
//! as an unordered provider (libfabric's RDM endpoints) may deliver them.

use super::window::{Inbound, Outbound};
use super::*;
use crate::test_tags;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEY: u64 = 77;
/// Receive addresses start here, so that a write that forgot its offset or
/// its base lands outside every receive.
const BASE: u64 = 0x10_000;

enum Net {
    Rts { id: u64, msg: usize },
    Grant([u8; GRANT_LEN]),
    Data { addr: u64, bytes: Vec<u8>, imm: u32 },
}

/// Takes a random element out of `v`.
fn pick<T>(rng: &mut StdRng, v: &mut Vec<T>) -> T {
    let i = rng.random_range(0..v.len());
    v.swap_remove(i)
}

/// One sender and one receiver, `lens.len()` messages; the receiver posts
/// its receives in a random order. Returns the number of ticks taken.
fn run_messages(
    seed: u64,
    lens: &[usize],
    slots: usize,
    seg: usize,
    window: usize,
) -> Result<usize, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let msgs: Vec<Vec<u8>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.random()).collect())
        .collect();
    let mut base = Vec::with_capacity(msgs.len());
    let mut total = 0u64;
    for m in &msgs {
        base.push(BASE + total);
        total += m.len() as u64 + 3;
    }
    let mut rmem = vec![0u8; total as usize];
    let mut tx = Sender::new(1, seg, window).map_err(|e| e.to_string())?;
    let mut rx = Receiver::new(0, slots, seg).map_err(|e| e.to_string())?;

    let mut to_post: Vec<usize> = (0..msgs.len()).collect();
    let mut next_announce = 0;
    let mut posted = vec![false; msgs.len()];
    let mut announced: Vec<Option<u64>> = vec![None; msgs.len()];
    let mut net: Vec<Net> = Vec::new();
    let mut cq: Vec<u32> = Vec::new();
    let mut local: Vec<u64> = Vec::new();
    let mut sent = vec![false; msgs.len()];
    let mut received = vec![false; msgs.len()];
    let (mut nsent, mut nrecv) = (0, 0);

    let clear = |rx: &mut Receiver, i: usize, id: u64| {
        rx.clear_to_send(ToGrant {
            id,
            req: i as u64,
            addr: base[i],
            key: KEY,
            len: msgs[i].len() as u64,
        })
    };

    for tick in 0..1_000_000 {
        if nsent == msgs.len() && nrecv == msgs.len() {
            if !tx.is_idle() || !rx.is_idle() || !net.is_empty() || !cq.is_empty() {
                return Err("work left over after every message completed".into());
            }
            for (i, m) in msgs.iter().enumerate() {
                let at = (base[i] - BASE) as usize;
                if &rmem[at..at + m.len()] != m.as_slice() {
                    return Err(format!("message {i} ({} bytes) landed wrong", m.len()));
                }
            }
            return Ok(tick);
        }
        match rng.random_range(0..7) {
            0 if next_announce < msgs.len() => {
                let i = next_announce;
                next_announce += 1;
                let id = tx.announce(
                    i as u64,
                    test_tags::tag(1, 0, 8, 0, i as u32),
                    msgs[i].len(),
                    0,
                );
                net.push(Net::Rts { id, msg: i });
            }
            1 if !to_post.is_empty() => {
                let i = pick(&mut rng, &mut to_post);
                posted[i] = true;
                if let Some(id) = announced[i] {
                    clear(&mut rx, i, id).map_err(|e| e.to_string())?;
                }
            }
            2 | 3 if !net.is_empty() => match pick(&mut rng, &mut net) {
                Net::Rts { id, msg } => {
                    announced[msg] = Some(id);
                    if posted[msg] {
                        clear(&mut rx, msg, id).map_err(|e| e.to_string())?;
                    }
                }
                Net::Grant(b) => {
                    let g = Grant::decode(0, &b).map_err(|e| e.to_string())?;
                    tx.granted(g).map_err(|e| e.to_string())?;
                }
                Net::Data { addr, bytes, imm } => {
                    let inside = base.iter().zip(&msgs).any(|(&b, m)| {
                        addr >= b && addr + bytes.len() as u64 <= b + m.len() as u64
                    });
                    if !inside {
                        return Err(format!(
                            "a write of {} bytes at {addr:#x} lies outside every receive",
                            bytes.len()
                        ));
                    }
                    let at = (addr - BASE) as usize;
                    rmem[at..at + bytes.len()].copy_from_slice(&bytes);
                    cq.push(imm);
                }
            },
            4 if !cq.is_empty() => {
                let imm = pick(&mut rng, &mut cq);
                let Imm::Message { slot, generation } = Imm::decode(imm) else {
                    return Err(format!(
                        "a message write carried a window immediate {imm:#x}"
                    ));
                };
                if let Some(req) = rx.landed(slot, generation).map_err(|e| e.to_string())? {
                    let i = req as usize;
                    if std::mem::replace(&mut received[i], true) {
                        return Err(format!("receive {i} completed twice"));
                    }
                    nrecv += 1;
                }
            }
            5 if !local.is_empty() => {
                let req = pick(&mut rng, &mut local);
                if let Some(req) = tx.written(req).map_err(|e| e.to_string())? {
                    let i = req as usize;
                    if std::mem::replace(&mut sent[i], true) {
                        return Err(format!("send {i} completed twice"));
                    }
                    nsent += 1;
                }
            }
            _ => {
                // The backends' progress: post what may go.
                while let Some(w) = tx.next_write() {
                    let m = &msgs[w.req as usize];
                    if w.key != KEY || w.offset + w.len > m.len() || w.len > seg {
                        return Err(format!(
                            "a bad write {w:?} for a message of {} bytes",
                            m.len()
                        ));
                    }
                    net.push(Net::Data {
                        addr: w.remote_addr,
                        bytes: m[w.offset..w.offset + w.len].to_vec(),
                        imm: w.imm,
                    });
                    local.push(w.req);
                }
                while let Some((g, _)) = rx.next_grant() {
                    net.push(Net::Grant(g.encode()));
                }
            }
        }
        if tx.in_flight() > window {
            return Err(format!(
                "{} writes in flight, window {window}",
                tx.in_flight()
            ));
        }
        if rx.granted() > slots {
            return Err(format!("{} receives granted, {slots} slots", rx.granted()));
        }
    }
    Err(format!(
        "no progress: {nsent} of {} sends and {nrecv} receives done, {} granted, {} waiting for a slot, {} announcements ungranted",
        msgs.len(),
        rx.granted(),
        rx.waiting(),
        tx.waiting()
    ))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_message_lands_exactly_whatever_the_order(
        seed: u64,
        lens in proptest::collection::vec(0usize..700, 1..40),
        slots in 1usize..6,
        seg in 1usize..200,
        window in 1usize..9,
    ) {
        if let Err(e) = run_messages(seed, &lens, slots, seg, window) {
            prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn many_large_messages_through_one_slot() {
    let lens: Vec<usize> = (0..64).map(|i| 1000 + 997 * i).collect();
    run_messages(7, &lens, 1, 4096, 3).unwrap();
}

/// `ranks` ranks, each owning one persistent window written by every other
/// rank in `per_writer` chunks of `chunk` bytes a round, for `rounds`
/// rounds with contents that change every round. Returns the control
/// messages (`Ready`) each rank sent per round, for every round.
fn run_rounds(
    seed: u64,
    ranks: usize,
    per_writer: usize,
    chunk: usize,
    rounds: usize,
) -> Result<Vec<Vec<usize>>, String> {
    struct Rank {
        inbound: Inbound,
        outbound: Vec<Outbound>,
        mem: Vec<u8>,
        /// The round this rank is in (1-based, not wrapped), and whether its
        /// writes of that round are posted.
        round: usize,
        wrote: bool,
        ready_sent: Vec<usize>,
    }
    let byte = |round: usize, writer: usize, c: usize, i: usize| {
        (round * 31 + writer * 7 + c * 3 + i) as u8
    };
    let chunks = per_writer * (ranks - 1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rk: Vec<Rank> = (0..ranks)
        .map(|_| Rank {
            inbound: Inbound::new(0, chunks).expect("chunks in range"),
            outbound: (0..ranks).map(|p| Outbound::new(p as u32, 0)).collect(),
            mem: vec![0; chunks * chunk],
            round: 0,
            wrote: true,
            ready_sent: Vec::new(),
        })
        .collect();
    // In flight: (from, to, Ready round) and (from, to, chunk, round, bytes).
    let mut readies: Vec<(usize, usize, u8)> = Vec::new();
    let mut writes: Vec<(usize, usize, u16, u32, Vec<u8>)> = Vec::new();
    for _ in 0..10_000_000 {
        if rk
            .iter()
            .all(|r| r.round == rounds && r.inbound.is_complete() && r.wrote)
            && readies.is_empty()
            && writes.is_empty()
        {
            return Ok(rk.into_iter().map(|r| r.ready_sent).collect());
        }
        match rng.random_range(0..3) {
            0 if !readies.is_empty() => {
                let (from, to, round) = pick(&mut rng, &mut readies);
                rk[to].outbound[from]
                    .ready(round)
                    .map_err(|e| e.to_string())?;
            }
            1 if !writes.is_empty() => {
                let (from, to, c, imm, bytes) = pick(&mut rng, &mut writes);
                let Imm::Window {
                    round,
                    chunk: named,
                    ..
                } = Imm::decode(imm)
                else {
                    return Err("a window write carried a message immediate".into());
                };
                if named != c {
                    return Err(format!("chunk {c} sent as {named}"));
                }
                let r = &mut rk[to];
                let at = c as usize * chunk;
                r.mem[at..at + bytes.len()].copy_from_slice(&bytes);
                if r.inbound
                    .landed(from as u32, round, c)
                    .map_err(|e| e.to_string())?
                {
                    // Round complete: every byte is this round's.
                    let done = r.round;
                    for c in 0..chunks {
                        let writer = c / per_writer;
                        let writer = if writer >= to { writer + 1 } else { writer };
                        for i in 0..chunk {
                            if r.mem[c * chunk + i] != byte(done, writer, c, i) {
                                return Err(format!(
                                    "rank {to} round {done}: chunk {c} byte {i} from rank {writer} is stale"
                                ));
                            }
                        }
                    }
                }
            }
            _ => {
                // Each rank: start its next round once its window is read
                // and its own writes are out, then write where allowed.
                let me = rng.random_range(0..ranks);
                let r = &mut rk[me];
                if r.inbound.is_complete() && r.wrote && r.round < rounds {
                    let round = r.inbound.begin().map_err(|e| e.to_string())?;
                    r.round += 1;
                    r.wrote = false;
                    r.ready_sent.push(0);
                    for p in (0..ranks).filter(|&p| p != me) {
                        readies.push((me, p, round));
                        *r.ready_sent.last_mut().expect("pushed") += 1;
                    }
                }
                if !r.wrote {
                    let round = r.round as u8;
                    let peers: Vec<usize> = (0..ranks).filter(|&p| p != me).collect();
                    if peers.iter().all(|&p| r.outbound[p].may_write(round)) {
                        for p in peers {
                            let slot = if me > p { me - 1 } else { me };
                            for k in 0..per_writer {
                                let c = slot * per_writer + k;
                                let imm = Imm::Window {
                                    window: 0,
                                    round,
                                    chunk: c as u16,
                                }
                                .encode();
                                let bytes = (0..chunk).map(|i| byte(r.round, me, c, i)).collect();
                                writes.push((me, p, c as u16, imm, bytes));
                            }
                        }
                        r.wrote = true;
                    }
                }
            }
        }
    }
    Err("persistent rounds made no progress".into())
}

#[test]
fn persistent_rounds_cost_one_ready_per_peer_whatever_the_size() {
    for ranks in [2, 3, 5] {
        for (per_writer, chunk) in [(1, 16), (4, 4096)] {
            let sent = run_rounds(ranks as u64, ranks, per_writer, chunk, 300)
                .unwrap_or_else(|e| panic!("{ranks} ranks, {per_writer} x {chunk} B: {e}"));
            for (me, per_round) in sent.iter().enumerate() {
                assert_eq!(per_round.len(), 300);
                assert!(
                    per_round.iter().all(|&n| n == ranks - 1),
                    "rank {me} of {ranks}: Ready messages per round {per_round:?}"
                );
            }
        }
    }
}
