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
//! Preparing and forgetting go through the mailbox like any operation
//! (`Plan::Prepare`, `Plan::Unprepare`), so they happen between operations:
//! growing scratch while an operation reads it would pull memory from
//! under its transfers. They complete at once and move no bytes.

use super::{Engine, Ptr, REGISTRATIONS};
use crate::algo::Schedule;
use crate::operation::OpDesc;
use gw_transport::{Error, MemHandle, Result};
use std::sync::atomic::Ordering;

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
}

impl Engine {
    /// Plans the persistent operation `id` on the buffers of `op`.
    pub(super) fn prepare(&mut self, op: &OpDesc, id: u64, sched: Box<dyn Schedule>) -> Result<()> {
        if self.prepared.iter().any(|p| p.id == id) {
            return Err(Error::Internal(format!(
                "persistent operation {id} prepared twice"
            )));
        }
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
        self.prepared.push(Prepared {
            id,
            sched: Some(sched),
            send: op.send,
            send_bytes: op.send_bytes,
            recv: op.recv,
            recv_bytes: op.recv_bytes,
            handles,
        });
        Ok(())
    }

    /// Forgets the persistent operation `id` and deregisters its buffers.
    pub(super) fn unprepare(&mut self, id: u64) -> Result<()> {
        let Some(i) = self.prepared.iter().position(|p| p.id == id) else {
            return Err(Error::InvalidUsage(format!(
                "persistent operation {id} is not prepared (freed twice?)"
            )));
        };
        let p = self.prepared.swap_remove(i);
        let mut res = Ok(());
        for (t, (hs, hr)) in self.transports.iter_mut().zip(p.handles) {
            for h in [hs, hr] {
                if let Err(e) = t.deregister(h)
                    && res.is_ok()
                {
                    res = Err(e);
                }
            }
        }
        res
    }

    /// The rewound schedule of a round of `id`, whose buffers must be those
    /// it was prepared with; its registrations go into `handles`.
    pub(super) fn take_prepared(
        &mut self,
        id: u64,
        op: &OpDesc,
        handles: &mut [Option<(MemHandle, MemHandle)>],
    ) -> Result<Box<dyn Schedule>> {
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
        for (slot, h) in handles.iter_mut().zip(&p.handles) {
            *slot = Some(*h);
        }
        Ok(sched)
    }

    /// Gives a finished round's schedule back to its entry.
    pub(super) fn put_prepared(&mut self, id: u64, sched: Box<dyn Schedule>) {
        if let Some(p) = self.prepared.iter_mut().find(|p| p.id == id) {
            p.sched = Some(sched);
        }
    }
}
