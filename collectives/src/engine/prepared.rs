//! Persistent operations on the engine's side: what a persistent request
//! (`persistent.rs`) planned once, kept here so that every round reuses it.
//!
//! Why this exists: an ordinary collective finds its schedule in the cache
//! (`sched_cache.rs`), which may have evicted it, registers the caller's
//! buffers with the transport on first use, and deregisters them when it
//! finishes, since the next call may bring other memory. A persistent
//! all-reduce (MPI's `MPI_Allreduce_init`, the GDRAA style of registering
//! once and then only moving data) knows its buffers for its whole life, so
//! all of that is done once, when it is prepared: the schedule is built and
//! owned by its entry here (never evicted), scratch is grown to what it
//! needs, and both buffers are registered with every transport. A round
//! (`Plan::Prepared`) then takes the schedule out of its entry, rewinds it,
//! lends the registrations to the running operation, and puts the schedule
//! back when it finishes; nothing is built, registered or allocated.
//!
//! A one-sided plan (`algo/onesided.rs`, GDRAA) also owns a window, memory
//! its peers write into, registered here with every transport; both it and
//! the receive buffer are published (`Transport::remote_region`) and the
//! caller exchanges the descriptors with the peers once (`Plan::Attach`
//! brings theirs). Each round is then stamped with its number, which every
//! rank counts alike, so that an immediate of another round is told apart.
//!
//! Preparing and forgetting go through the mailbox like any operation
//! (`Plan::Prepare`, `Plan::Unprepare`), so they happen between operations:
//! growing scratch while an operation reads it would pull memory from
//! under its transfers. They complete at once and move no bytes.

use super::user_regs::{Mem, OpMem, Whose};
use super::{Engine, Ptr, Published, REGISTRATIONS, Running, Spare};
use crate::algo::{Buf, Schedule};
use crate::operation::OpDesc;
use gw_transport::seam::RemoteRegion;
use gw_transport::{Error, MemHandle, Rank, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What a round of a persistent operation runs with: its schedule, its
/// window (address and bytes) and its number (mod 256).
pub(super) type Round = (Box<dyn Schedule>, (Ptr, usize), u8);

/// A region as `Published` carries it.
fn encode(r: &RemoteRegion) -> [u64; 4] {
    [u64::from(r.rank), r.key, r.addr, r.len]
}

fn decode(v: &[u64]) -> RemoteRegion {
    RemoteRegion {
        rank: v[0] as Rank,
        key: v[1],
        addr: v[2],
        len: v[3],
    }
}

/// One persistent operation's plan.
pub(super) struct Prepared {
    id: u64,
    /// Out while a round runs (the running operation holds it).
    sched: Option<Box<dyn Schedule>>,
    send: Ptr,
    send_bytes: usize,
    recv: Ptr,
    recv_bytes: usize,
    /// Per transport: (send, recv) registrations, made once.
    handles: Vec<(MemHandle, MemHandle)>,
    /// The one-sided window (empty for a two-sided plan) and its
    /// registration per transport (those with one-sided writes).
    window: Vec<u64>,
    window_handles: Vec<Option<MemHandle>>,
    /// Per peer: its published (recv, window) regions, once attached.
    remotes: Vec<Option<(RemoteRegion, RemoteRegion)>>,
    /// Rounds started so far (mod 256, as immediates carry them).
    rounds: u8,
}

impl Engine {
    /// A persistent plan's registration on transport `t` holding `len`
    /// bytes at `ptr` (its send or receive buffer), lent: the direct path
    /// runs small persistent rounds on these buffers.
    pub(super) fn prepared_mem(&self, t: usize, ptr: *mut u8, len: usize) -> Option<Mem> {
        let at = ptr as usize;
        let within = |base: Ptr, bytes: usize| {
            let b = base.0 as usize;
            len > 0 && at >= b && at.saturating_add(len) <= b.saturating_add(bytes)
        };
        self.prepared.iter().find_map(|p| {
            let &(hs, hr) = p.handles.get(t)?;
            let (handle, base) = if within(p.send, p.send_bytes) {
                (hs, p.send)
            } else if within(p.recv, p.recv_bytes) {
                (hr, p.recv)
            } else {
                return None;
            };
            Some(Mem {
                handle,
                offset: at - base.0 as usize,
                whose: Whose::Lent,
            })
        })
    }

    /// Plans the persistent operation `id` on the buffers of `op`: the
    /// one-sided schedule if there is one and every peer it talks to is
    /// reached by a transport with one-sided writes (done in hardware, if
    /// the flag says so), else `sched`.
    pub(super) fn prepare(
        &mut self,
        op: &OpDesc,
        id: u64,
        sched: Option<Box<dyn Schedule>>,
        one_sided: Option<(Box<dyn Schedule>, bool)>,
        out: &Arc<Mutex<Published>>,
    ) -> Result<()> {
        if self.prepared.iter().any(|p| p.id == id) {
            return Err(Error::Internal(format!(
                "persistent operation {id} prepared twice"
            )));
        }
        // The first peer the one-sided schedule cannot write to, or read
        // from (with `true`), if any.
        let mut unreachable = None;
        let one_sided = match one_sided {
            Some((mut os, offloaded_only)) => {
                let (peers, reads) = super::super::persistent::peers_and_readers(os.as_mut())?;
                let on = |p: Rank, ok: &dyn Fn(usize) -> bool| {
                    self.route.get(p as usize).is_some_and(|&t| ok(t))
                };
                unreachable = peers
                    .into_iter()
                    .find(|&p| {
                        !on(p, &|t| {
                            self.one_sided[t] && (self.offloaded[t] || !offloaded_only)
                        })
                    })
                    .map(|p| (p, false))
                    .or_else(|| {
                        reads
                            .into_iter()
                            .find(|&p| !on(p, &|t| self.reads[t]))
                            .map(|p| (p, true))
                    });
                unreachable.is_none().then_some(os)
            }
            None => None,
        };
        let (sched, chosen) = match (one_sided, sched) {
            (Some(os), _) => (os, true),
            (None, Some(s)) => (s, false),
            (None, None) => {
                let peer = unreachable.map_or("a peer".into(), |(p, _)| format!("rank {p}"));
                let how = unreachable
                    .and_then(|(p, _)| self.route.get(p as usize))
                    .map_or("?", |&t| self.transports[t].properties().name);
                let what = match unreachable {
                    Some((_, true)) => "reads",
                    _ => "writes",
                };
                return Err(Error::InvalidUsage(format!(
                    "persistent operation {id} needs one-sided {what}, and the transport to {peer} ({how}) has none"
                )));
            }
        };
        self.ensure_scratch(sched.scratch_elems() * op.kernel.dtype.size())?;
        let mut handles = Vec::with_capacity(self.transports.len());
        let mut registered = Ok(());
        for t in self.transports.iter_mut() {
            // SAFETY: the persistent request's owner keeps both buffers valid
            // until it is forgotten (`unprepare`), which deregisters them.
            let hs = match unsafe { t.register(op.send.0, op.send_bytes) } {
                Ok(h) => h,
                Err(e) => {
                    registered = Err(e);
                    break;
                }
            };
            // SAFETY: as above.
            match unsafe { t.register(op.recv.0, op.recv_bytes) } {
                Ok(hr) => {
                    handles.push((hs, hr));
                    REGISTRATIONS.fetch_add(2, Ordering::Relaxed);
                }
                Err(e) => {
                    let _ = t.deregister(hs);
                    registered = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = registered {
            for (t, (hs, hr)) in self.transports.iter_mut().zip(handles) {
                let _ = t.deregister(hs);
                let _ = t.deregister(hr);
            }
            return Err(e);
        }
        let mut p = Prepared {
            id,
            send: op.send,
            send_bytes: op.send_bytes,
            recv: op.recv,
            recv_bytes: op.recv_bytes,
            handles,
            window: Vec::new(),
            window_handles: vec![None; self.transports.len()],
            remotes: vec![None; self.route.len()],
            rounds: 0,
            sched: None,
        };
        let window_bytes = sched.window_elems() * op.kernel.dtype.size();
        let mut published = Published::default();
        if chosen {
            if let Err(e) = self.publish(&mut p, window_bytes, &mut published) {
                let _ = self.forget(p);
                return Err(e);
            }
            published.one_sided = true;
        }
        // Immediates that come early wait in `arrived`; make the room now.
        let room = sched.landed_actions();
        reserve(&mut self.spare.expect, room);
        reserve(&mut self.spare.arrived, room);
        reserve(&mut self.spare.window_handles, self.transports.len());
        p.sched = Some(sched);
        self.prepared.push(p);
        if let Ok(mut o) = out.lock() {
            *o = published;
        }
        Ok(())
    }

    /// Allocates and registers `p`'s window of `bytes`, and says what this
    /// rank publishes to each peer (through the transport that reaches it).
    /// A window of no bytes (a put writes into the receive buffer) is not
    /// registered.
    fn publish(&mut self, p: &mut Prepared, bytes: usize, out: &mut Published) -> Result<()> {
        p.window = vec![0u64; bytes.div_ceil(8)];
        let wptr = p.window.as_mut_ptr().cast::<u8>();
        let mut regions: Vec<Option<(RemoteRegion, RemoteRegion)>> =
            vec![None; self.transports.len()];
        for (t, tr) in self.transports.iter_mut().enumerate() {
            if !self.one_sided[t] {
                continue;
            }
            let recv = tr.remote_region(p.handles[t].1)?;
            let win = if bytes > 0 {
                // SAFETY: the window lives in `p` until `forget` deregisters it.
                let h = unsafe { tr.register(wptr, bytes)? };
                REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
                p.window_handles[t] = Some(h);
                tr.remote_region(h)?
            } else {
                // No window: the second descriptor is this rank's send
                // buffer, which a get reads (`put.rs`); its `len`, the
                // bytes this rank writes a round, lets a put's target
                // check that they fit.
                tr.remote_region(p.handles[t].0)?
            };
            if let (Some(rv), Some(w)) = (recv, win) {
                regions[t] = Some((rv, w));
            }
        }
        out.regions = (0..self.route.len())
            .map(|peer| {
                let mut d = [0u64; 8];
                if let Some((rv, w)) = self.route.get(peer).and_then(|&t| regions[t]) {
                    d[..4].copy_from_slice(&encode(&rv));
                    d[4..].copy_from_slice(&encode(&w));
                }
                d
            })
            .collect();
        Ok(())
    }

    /// Stores the regions the peers of `id` published (per peer; all zero
    /// for peers it does not write to).
    pub(super) fn attach(&mut self, id: u64, remotes: Vec<[u64; 8]>) -> Result<()> {
        let Some(p) = self.prepared.iter_mut().find(|p| p.id == id) else {
            return Err(Error::InvalidUsage(format!(
                "persistent operation {id} is not prepared"
            )));
        };
        for (peer, d) in remotes.iter().enumerate() {
            if d.iter().all(|&v| v == 0) {
                continue;
            }
            let (rv, w) = (decode(&d[..4]), decode(&d[4..]));
            if rv.rank as usize != peer || w.rank as usize != peer {
                return Err(Error::Protocol(format!(
                    "rank {peer} published regions of rank {} and {} for persistent operation {id}",
                    rv.rank, w.rank
                )));
            }
            if let Some(slot) = p.remotes.get_mut(peer) {
                *slot = Some((rv, w));
            }
        }
        Ok(())
    }

    /// The region `peer` published for `buf` of the running round's plan.
    pub(super) fn remote_of(&self, r: &Running, peer: Rank, buf: Buf) -> Result<RemoteRegion> {
        let id = r.prepared.ok_or_else(|| {
            Error::Internal("a one-sided write outside a persistent operation".into())
        })?;
        let p = self
            .prepared
            .iter()
            .find(|p| p.id == id)
            .ok_or_else(|| Error::Internal(format!("persistent operation {id} vanished")))?;
        let Some((rv, w)) = p.remotes.get(peer as usize).copied().flatten() else {
            return Err(Error::Internal(format!(
                "persistent operation {id} writes to rank {peer}, which published no region for it"
            )));
        };
        match buf {
            Buf::Recv => Ok(rv),
            Buf::Window if !p.window.is_empty() => Ok(w),
            // Without a window the second region is the send buffer.
            Buf::Send if p.window.is_empty() => Ok(w),
            other => Err(Error::Internal(format!(
                "a one-sided operation on the peer's {other:?}, which it did not publish"
            ))),
        }
    }

    /// Deregisters everything `p` registered.
    fn forget(&mut self, p: Prepared) -> Result<()> {
        let mut res = Ok(());
        for (t, (hs, hr)) in p.handles.into_iter().enumerate() {
            for h in [
                Some(hs),
                Some(hr),
                p.window_handles.get(t).copied().flatten(),
            ]
            .into_iter()
            .flatten()
            {
                if let Err(e) = self.transports[t].deregister(h)
                    && res.is_ok()
                {
                    res = Err(e);
                }
            }
        }
        res
    }

    /// Forgets the persistent operation `id` and deregisters its buffers.
    pub(super) fn unprepare(&mut self, id: u64) -> Result<()> {
        let Some(i) = self.prepared.iter().position(|p| p.id == id) else {
            return Err(Error::InvalidUsage(format!(
                "persistent operation {id} is not prepared (freed twice?)"
            )));
        };
        let p = self.prepared.swap_remove(i);
        self.forget(p)
    }

    /// The rewound schedule of a round of `id`, whose buffers must be those
    /// it was prepared with; its registrations go into `spare`. Also its
    /// window and the round's number (mod 256).
    pub(super) fn take_prepared(
        &mut self,
        id: u64,
        op: &OpDesc,
        spare: &mut Spare,
    ) -> Result<Round> {
        let Some(p) = self.prepared.iter_mut().find(|p| p.id == id) else {
            return Err(Error::InvalidUsage(format!(
                "persistent operation {id} was freed or never prepared"
            )));
        };
        if (p.send, p.send_bytes, p.recv, p.recv_bytes)
            != (op.send, op.send_bytes, op.recv, op.recv_bytes)
        {
            return Err(Error::Internal(format!(
                "a round of persistent operation {id} came with other buffers than it was prepared with"
            )));
        }
        let Some(sched) = p.sched.as_mut() else {
            return Err(Error::InvalidUsage(format!(
                "persistent operation {id} started while a round of it is running"
            )));
        };
        if !sched.reset() {
            return Err(Error::Internal(format!(
                "persistent operation {id}'s schedule could not be rewound"
            )));
        }
        let sched = p
            .sched
            .take()
            .ok_or_else(|| Error::Internal("schedule vanished".into()))?;
        for (slot, &(hs, hr)) in spare.handles.iter_mut().zip(&p.handles) {
            *slot = Some(OpMem::lent(hs, hr));
        }
        for (slot, h) in spare.window_handles.iter_mut().zip(&p.window_handles) {
            *slot = *h;
        }
        p.rounds = p.rounds.wrapping_add(1);
        let window = (Ptr(p.window.as_mut_ptr().cast::<u8>()), p.window.len() * 8);
        Ok((sched, window, p.rounds))
    }

    /// Gives a finished round's schedule back to its entry.
    pub(super) fn put_prepared(&mut self, id: u64, sched: Box<dyn Schedule>) {
        if let Some(p) = self.prepared.iter_mut().find(|p| p.id == id) {
            p.sched = Some(sched);
        }
    }
}

/// Grows `v`'s capacity to at least `n`, at init, so that rounds do not.
fn reserve<T>(v: &mut Vec<T>, n: usize) {
    if v.capacity() < n {
        v.reserve(n - v.len());
    }
}
