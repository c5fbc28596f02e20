//! Closing endpoints of providers that reach a peer in the same process
//! through that peer's own memory.
//!
//! libfabric 1.17's shm provider maps each peer's region from `/dev/shm`,
//! except a peer in the same process: that one it uses through the peer
//! endpoint's own mapping, which `fi_close` of the peer unmaps. A rank that
//! is still progressing (answering a send the peer made, acknowledging a
//! write) then faults on the unmapped region, inside `fi_cq_read`. Between
//! processes it cannot happen, each side keeping its own mapping; within
//! one, it is what a program holding two communicators sees when one
//! finishes first, and what gradwire's tests (whole worlds in one process)
//! saw as a SIGSEGV in `pthread_spin_trylock` under libfabric.
//!
//! So an endpoint of such a provider is not closed while an open endpoint
//! of this process has it as a peer: it lingers, and is closed when the
//! last such peer closes. A lingering endpoint receives nothing more
//! (nobody reads its completion queue), and costs its region until then;
//! endpoints whose peers are all in other processes close at once.

use crate::fabric::DomainCore;
use crate::ffi::{self, Fid, FidAv, FidCq, FidEp};
use crate::fi_call;
use std::sync::{Arc, Mutex};

/// Whether endpoints of `provider` must linger (see the module comment).
pub(crate) fn needed(provider: &str) -> bool {
    provider.eq_ignore_ascii_case("shm")
}

/// What closing an endpoint closes, with what must outlive it.
pub(crate) struct Closable<S> {
    pub domain: Arc<DomainCore>,
    pub ep: *mut FidEp,
    pub av: *mut FidAv,
    pub cq: *mut FidCq,
    /// The operation contexts the provider may still write into until the
    /// endpoint is closed.
    pub slots: S,
}

// SAFETY: the objects are used only under their domain's lock (see
// `EpCore`), and a lingering endpoint is used by no one until it is closed.
unsafe impl<S: Send> Send for Closable<S> {}

impl<S> Closable<S> {
    /// Closes the endpoint, then its address vector and completion queue
    /// (the endpoint is bound to both), then lets the contexts go.
    pub fn close(self) {
        {
            let _g = self.domain.lock();
            self.close_objects();
        }
        drop(self.slots);
    }

    fn close_objects(&self) {
        for (what, fid) in [
            ("fi_close(ep)", self.ep.cast::<Fid>()),
            ("fi_close(av)", self.av.cast::<Fid>()),
            ("fi_close(cq)", self.cq.cast::<Fid>()),
        ] {
            if fid.is_null() {
                continue;
            }
            // SAFETY: each object was opened on this domain, is used by no
            // one else now and is closed once, the endpoint first.
            let ret = unsafe { ffi::gw_ofi_close(fid) };
            if ret != 0 {
                tracing::warn!("{}", fi_call(what, ret as isize));
            }
        }
    }
}

/// One endpoint that may have to linger: its name, the names of the peers
/// in its address vector, and, once its owner has closed it, what closing
/// it takes.
struct Entry<S> {
    id: u64,
    name: Vec<u8>,
    peers: Vec<Vec<u8>>,
    closed: Option<Closable<S>>,
}

struct Table<S> {
    next_id: u64,
    entries: Vec<Entry<S>>,
}

impl<S> Table<S> {
    /// Takes out the closed endpoints that no open endpoint has as a peer.
    fn unreferenced(&mut self) -> Vec<Closable<S>> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            let wanted = e.closed.is_none()
                || self
                    .entries
                    .iter()
                    .any(|o| o.closed.is_none() && o.peers.contains(&e.name));
            if wanted {
                i += 1;
            } else if let Some(c) = self.entries.swap_remove(i).closed {
                due.push(c);
            }
        }
        due
    }
}

/// The process's endpoints that may have to linger (the slot type is the
/// endpoint's).
pub(crate) struct Registry<S>(Mutex<Table<S>>);

impl<S> Registry<S> {
    pub const fn new() -> Registry<S> {
        Registry(Mutex::new(Table {
            next_id: 0,
            entries: Vec::new(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<S>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An endpoint named `name` was opened; returns its id here.
    pub fn opened(&self, name: Vec<u8>) -> u64 {
        let mut t = self.lock();
        let id = t.next_id;
        t.next_id += 1;
        t.entries.push(Entry {
            id,
            name,
            peers: Vec::new(),
            closed: None,
        });
        id
    }

    /// Endpoint `id` put `peer` in its address vector.
    pub fn peer_added(&self, id: u64, peer: &[u8]) {
        let mut t = self.lock();
        if let Some(e) = t.entries.iter_mut().find(|e| e.id == id)
            && !e.peers.iter().any(|p| p == peer)
        {
            e.peers.push(peer.to_vec());
        }
    }

    /// Endpoint `id` was closed by its owner: closes it now unless an open
    /// endpoint has it as a peer, and closes whatever lingered only for it.
    pub fn close(&self, id: u64, ep: Closable<S>) {
        let due = {
            let mut t = self.lock();
            match t.entries.iter_mut().find(|e| e.id == id) {
                Some(e) => e.closed = Some(ep),
                None => {
                    drop(t);
                    ep.close();
                    return;
                }
            }
            t.unreferenced()
        };
        for e in due {
            e.close();
        }
    }

    /// Endpoints lingering now.
    pub fn lingering(&self) -> usize {
        self.lock()
            .entries
            .iter()
            .filter(|e| e.closed.is_some())
            .count()
    }
}
