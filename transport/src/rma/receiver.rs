//! One peer's receive side of the one-sided path: which receives are
//! granted to the sender, which wait for a slot, and how many writes each
//! granted receive still expects.
//!
//! A receive is *granted* by telling the sender its address, key and slot
//! (a [`Grant`]); the sender then writes it in segments, each carrying the
//! slot in its immediate, and the receive is complete when the last of its
//! segments has landed. Slots are the credits of this path: there is a fixed
//! number per peer, so a receiver never has more memory exposed to one peer
//! than it chose, and a cleared receive that finds every slot busy waits
//! here until one frees. Each reuse of a slot bumps its generation, so a
//! write that names an old use of the slot is caught instead of being
//! counted toward the new one.

use super::grant::Grant;
use super::imm::{GEN_MODULUS, MAX_SLOTS, segments};
use crate::error::{Error, Result};
use crate::seam::{POSTED_RESERVED, Rank};
use std::collections::VecDeque;

/// A receive whose sender has announced it and may now be granted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToGrant {
    /// The sender's announcement id, echoed in the grant.
    pub id: u64,
    /// The backend's request for the receive.
    pub req: u64,
    /// Where the sender writes, as it must address it.
    pub addr: u64,
    pub key: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug)]
struct Busy {
    req: u64,
    want: u32,
    got: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    generation: u32,
    busy: Option<Busy>,
}

/// Who wrote, in an error.
#[derive(Clone, Copy)]
enum PeerName {
    Rank(Rank),
    Any,
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerName::Rank(r) => write!(f, "rank {r}"),
            PeerName::Any => f.write_str("a peer"),
        }
    }
}

/// See the module comment.
#[derive(Debug)]
pub struct Receiver {
    /// The one peer whose writes land here, or `None` when shared by all.
    peer: Option<Rank>,
    seg: usize,
    slots: Vec<Slot>,
    free: Vec<u16>,
    waiting: VecDeque<ToGrant>,
    /// Grants to send, with the request each is for.
    grants: VecDeque<(Grant, u64)>,
}

impl Receiver {
    /// A receive side for writes from `peer` in segments of `seg` bytes,
    /// with `slots` receives granted at once at most.
    pub fn new(peer: Rank, slots: usize, seg: usize) -> Result<Receiver> {
        Receiver::make(Some(peer), slots, seg)
    }

    /// One receive side for the writes of every peer, with `slots` grants
    /// at once among them (a backend whose immediates arrive without their
    /// source tells peers apart by the slot: see `ToGrant::req`).
    pub fn shared(slots: usize, seg: usize) -> Result<Receiver> {
        Receiver::make(None, slots, seg)
    }

    fn make(peer: Option<Rank>, slots: usize, seg: usize) -> Result<Receiver> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "{slots} receive slots per peer: must be 1 to {MAX_SLOTS}"
            )));
        }
        if seg == 0 {
            return Err(Error::InvalidArgument("a segment of 0 bytes".into()));
        }
        Ok(Receiver {
            peer,
            seg,
            slots: vec![Slot::default(); slots],
            // Popped from the back: slot 0 is used first.
            free: (0..slots as u16).rev().collect(),
            waiting: VecDeque::with_capacity(POSTED_RESERVED),
            grants: VecDeque::with_capacity(slots),
        })
    }

    /// Grants `t` now if a slot is free, else when one frees.
    pub fn clear_to_send(&mut self, t: ToGrant) -> Result<()> {
        if usize::try_from(t.len).is_err() || t.addr.checked_add(t.len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "a receive of {} bytes at {:#x}",
                t.len, t.addr
            )));
        }
        if self.free.is_empty() {
            self.waiting.push_back(t);
        } else {
            self.grant(t);
        }
        Ok(())
    }

    fn grant(&mut self, t: ToGrant) {
        let Some(slot) = self.free.pop() else {
            return;
        };
        let s = &mut self.slots[slot as usize];
        s.generation = (s.generation + 1) % GEN_MODULUS;
        let want = segments(t.len as usize, self.seg);
        s.busy = Some(Busy {
            req: t.req,
            want: u32::try_from(want).unwrap_or(u32::MAX),
            got: 0,
        });
        let g = Grant {
            id: t.id,
            slot,
            generation: s.generation,
            addr: t.addr,
            key: t.key,
            len: t.len,
        };
        self.grants.push_back((g, t.req));
    }

    /// The next grant to send, and the request it is for (a receiver
    /// shared by several peers tells from it where the grant goes).
    pub fn next_grant(&mut self) -> Option<(Grant, u64)> {
        self.grants.pop_front()
    }

    /// One write of the peer's landed (its immediate named `slot` and
    /// `generation`): the receive's request once all its segments have.
    pub fn landed(&mut self, slot: u16, generation: u32) -> Result<Option<u64>> {
        // Built only for an error: landing allocates nothing.
        let peer = self.peer.map_or(PeerName::Any, PeerName::Rank);
        let n = self.slots.len();
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return Err(Error::Protocol(format!(
                "{peer} wrote into receive slot {slot}, past the {n} this rank grants"
            )));
        };
        let Some(b) = s.busy.as_mut() else {
            return Err(Error::Protocol(format!(
                "{peer} wrote into receive slot {slot}, which holds no grant"
            )));
        };
        if s.generation != generation {
            return Err(Error::Protocol(format!(
                "{peer} wrote into receive slot {slot} for use {generation}, but the slot is in use {} (a write for a message already complete)",
                s.generation
            )));
        }
        b.got += 1;
        if b.got < b.want {
            return Ok(None);
        }
        let req = b.req;
        s.busy = None;
        self.free.push(slot);
        if let Some(t) = self.waiting.pop_front() {
            self.grant(t);
        }
        Ok(Some(req))
    }

    /// Receives granted and not yet complete.
    pub fn granted(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Cleared receives waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing is granted, waiting or unsent.
    pub fn is_idle(&self) -> bool {
        self.granted() == 0 && self.waiting.is_empty() && self.grants.is_empty()
    }

    /// Forgets every receive (after an abort); generations go on, so a late
    /// write for a forgotten grant is still told apart from a new one.
    pub fn clear(&mut self) {
        self.waiting.clear();
        self.grants.clear();
        self.free.clear();
        for (i, s) in self.slots.iter_mut().enumerate().rev() {
            s.busy = None;
            self.free.push(i as u16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, len: u64) -> ToGrant {
        ToGrant {
            id,
            req: 100 + id,
            addr: 0x1000 * id,
            key: 9,
            len,
        }
    }

    #[test]
    fn receives_past_the_slots_wait_and_are_granted_in_order() {
        let mut r = Receiver::new(1, 2, 10).unwrap();
        for id in 0..4 {
            r.clear_to_send(t(id, 25)).unwrap();
        }
        let g0 = r.next_grant().unwrap().0;
        let g1 = r.next_grant().unwrap().0;
        assert_eq!((g0.id, g1.id), (0, 1));
        assert!(r.next_grant().is_none());
        assert_eq!((r.granted(), r.waiting()), (2, 2));
        // 25 bytes in 10-byte segments: three writes.
        assert_eq!(r.landed(g1.slot, g1.generation).unwrap(), None);
        assert_eq!(r.landed(g1.slot, g1.generation).unwrap(), None);
        assert_eq!(r.landed(g1.slot, g1.generation).unwrap(), Some(101));
        let g2 = r.next_grant().unwrap().0;
        assert_eq!((g2.id, g2.slot), (2, g1.slot));
        assert_ne!(g2.generation, g1.generation);
    }

    #[test]
    fn writes_for_old_or_unknown_grants_are_refused_naming_the_peer() {
        let mut r = Receiver::new(4, 1, 10).unwrap();
        r.clear_to_send(t(0, 0)).unwrap();
        let g = r.next_grant().unwrap().0;
        assert_eq!(r.landed(g.slot, g.generation).unwrap(), Some(100));
        let e = r.landed(g.slot, g.generation).unwrap_err().to_string();
        assert!(e.contains("rank 4") && e.contains("holds no grant"), "{e}");
        r.clear_to_send(t(1, 5)).unwrap();
        let g = r.next_grant().unwrap().0;
        let e = r.landed(g.slot, g.generation - 1).unwrap_err().to_string();
        assert!(e.contains("already complete"), "{e}");
        let e = r.landed(7, 0).unwrap_err().to_string();
        assert!(e.contains("past the 1"), "{e}");
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(Receiver::new(0, 0, 1).is_err());
        assert!(Receiver::new(0, MAX_SLOTS + 1, 1).is_err());
        assert!(Receiver::new(0, 1, 0).is_err());
        let mut r = Receiver::new(0, 1, 1).unwrap();
        let mut bad = t(1, 10);
        bad.addr = u64::MAX;
        assert!(r.clear_to_send(bad).is_err());
    }

    #[test]
    fn clear_frees_every_slot_and_keeps_generations() {
        let mut r = Receiver::new(0, 2, 4).unwrap();
        r.clear_to_send(t(0, 8)).unwrap();
        let old = r.next_grant().unwrap().0;
        r.clear();
        assert!(r.is_idle());
        r.clear_to_send(t(1, 8)).unwrap();
        let new = r.next_grant().unwrap().0;
        assert_eq!(new.slot, old.slot);
        assert!(r.landed(old.slot, old.generation).is_err());
    }
}
