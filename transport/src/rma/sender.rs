//! One peer's send side of the one-sided path: messages announced and
//! waiting for their grant, granted messages cut into segment writes, and a
//! bound on the writes in flight.
//!
//! A send too large for the eager path is announced (the backend sends an
//! `Rts` carrying [`Sender::announce`]'s id); the receiver answers with a
//! [`Grant`] once its receive is posted and a slot is free; the message then
//! goes as writes of at most one segment each, every one carrying the
//! grant's slot in its immediate. The send completes when every write has
//! completed locally (its buffer may be reused). Writes in flight are capped
//! (the provider's transmit queue is finite, and a capped queue keeps one
//! large message from delaying every other peer's); the rest are issued as
//! completions come back.
//!
//! A receiver that never grants would leave a send waiting for ever, so
//! [`Sender::check`] turns the oldest announcement's age into an error that
//! names the peer and the message, with the clock passed in (tests use a
//! fake one).

use super::grant::Grant;
use super::imm::{Imm, segments};
use crate::error::{Error, Result};
use crate::seam::{POSTED_RESERVED, Rank, Tag};
use std::collections::VecDeque;

/// A write for the backend to post: `len` bytes at `offset` of request
/// `req`'s buffer to `remote_addr` under `key`, carrying `imm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    pub req: u64,
    pub offset: usize,
    pub len: usize,
    pub remote_addr: u64,
    pub key: u64,
    pub imm: u32,
}

#[derive(Debug)]
struct Announced {
    id: u64,
    req: u64,
    len: usize,
    tag: Tag,
    since_ns: u64,
}

#[derive(Debug)]
struct Job {
    req: u64,
    len: usize,
    grant: Grant,
    nsegs: usize,
    issued: usize,
    done: usize,
}

/// See the module comment.
#[derive(Debug)]
pub struct Sender {
    peer: Rank,
    seg: usize,
    window: usize,
    next_id: u64,
    announced: VecDeque<Announced>,
    jobs: VecDeque<Job>,
    in_flight: usize,
}

impl Sender {
    /// A send side to `peer` in segments of `seg` bytes with at most
    /// `window` writes in flight.
    pub fn new(peer: Rank, seg: usize, window: usize) -> Result<Sender> {
        if seg == 0 || window == 0 {
            return Err(Error::InvalidArgument(format!(
                "one-sided sends need a segment and a window of at least 1 (segment {seg} bytes, window {window})"
            )));
        }
        Ok(Sender {
            peer,
            seg,
            window,
            next_id: 0,
            announced: VecDeque::with_capacity(POSTED_RESERVED),
            jobs: VecDeque::with_capacity(POSTED_RESERVED),
            in_flight: 0,
        })
    }

    /// Records request `req` (`len` bytes of message `tag`) as announced at
    /// `now_ns`; returns the id its `Rts` must carry.
    pub fn announce(&mut self, req: u64, tag: Tag, len: usize, now_ns: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.announced.push_back(Announced {
            id,
            req,
            len,
            tag,
            since_ns: now_ns,
        });
        id
    }

    /// The receiver granted an announced message: its writes may go.
    pub fn granted(&mut self, g: Grant) -> Result<()> {
        let peer = self.peer;
        let Some(k) = self.announced.iter().position(|a| a.id == g.id) else {
            return Err(Error::Protocol(format!(
                "rank {peer} granted announcement {} that this rank never made or was already granted",
                g.id
            )));
        };
        let a = &self.announced[k];
        if g.len != a.len as u64 {
            return Err(Error::Protocol(format!(
                "rank {peer} granted {} bytes for {} of {} bytes",
                g.len, a.tag, a.len
            )));
        }
        let Some(a) = self.announced.remove(k) else {
            return Err(Error::Internal("announcement vanished".into()));
        };
        self.jobs.push_back(Job {
            req: a.req,
            len: a.len,
            grant: g,
            nsegs: segments(a.len, self.seg),
            issued: 0,
            done: 0,
        });
        Ok(())
    }

    /// The next write to post, if one is granted and the window has room.
    pub fn next_write(&mut self) -> Option<Write> {
        if self.in_flight >= self.window {
            return None;
        }
        let seg = self.seg;
        let j = self.jobs.iter_mut().find(|j| j.issued < j.nsegs)?;
        let offset = j.issued * seg;
        let len = seg.min(j.len - offset.min(j.len));
        j.issued += 1;
        self.in_flight += 1;
        Some(Write {
            req: j.req,
            offset,
            len,
            remote_addr: j.grant.addr + offset as u64,
            key: j.grant.key,
            imm: Imm::Message {
                slot: j.grant.slot,
                generation: j.grant.generation,
            }
            .encode(),
        })
    }

    /// The backend could not post `w`, the last write [`Sender::next_write`]
    /// gave (the provider's queue was full): it is given again later.
    pub fn unwrite(&mut self, w: &Write) -> Result<()> {
        let seg = self.seg;
        let Some(j) = self.jobs.iter_mut().find(|j| j.req == w.req) else {
            return Err(Error::Internal(format!(
                "unwrite of request {}, which has no writes",
                w.req
            )));
        };
        if j.issued == 0 || (j.issued - 1) * seg != w.offset {
            return Err(Error::Internal(format!(
                "unwrite of bytes at {} of request {}, not its last write",
                w.offset, w.req
            )));
        }
        j.issued -= 1;
        self.in_flight -= 1;
        Ok(())
    }

    /// A write of request `req` completed locally: the request, once all
    /// of its writes have.
    pub fn written(&mut self, req: u64) -> Result<Option<u64>> {
        let Some(k) = self.jobs.iter().position(|j| j.req == req) else {
            return Err(Error::Internal(format!(
                "a write completed for request {req}, which has no writes to rank {}",
                self.peer
            )));
        };
        let j = &mut self.jobs[k];
        if j.done >= j.issued {
            return Err(Error::Internal(format!(
                "more writes of request {req} completed than were posted"
            )));
        }
        j.done += 1;
        self.in_flight -= 1;
        if j.done < j.nsegs {
            return Ok(None);
        }
        self.jobs.remove(k);
        Ok(Some(req))
    }

    /// Fails if the oldest announcement has waited `timeout_ns` for its
    /// grant at `now_ns`.
    pub fn check(&self, now_ns: u64, timeout_ns: u64) -> Result<()> {
        let Some(a) = self.announced.front() else {
            return Ok(());
        };
        let waited = now_ns.saturating_sub(a.since_ns);
        if waited < timeout_ns {
            return Ok(());
        }
        Err(Error::Timeout {
            secs: waited as f64 / 1e9,
            what: format!(
                "waiting for rank {} to grant {} ({} bytes): it has not posted that receive, or has stopped granting ({} announcements of this rank wait for it)",
                self.peer,
                a.tag,
                a.len,
                self.announced.len()
            ),
        })
    }

    /// Writes posted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Announced messages waiting for their grant.
    pub fn waiting(&self) -> usize {
        self.announced.len()
    }

    /// Whether nothing is announced, granted or in flight.
    pub fn is_idle(&self) -> bool {
        self.announced.is_empty() && self.jobs.is_empty()
    }

    /// Forgets every send (after an abort). Writes in flight complete or
    /// fail at the provider; their completions are then errors to ignore.
    pub fn clear(&mut self) {
        self.announced.clear();
        self.jobs.clear();
        self.in_flight = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tags;

    fn tag(i: u64) -> Tag {
        test_tags::tag(1, i, 8, 0, 0)
    }

    fn grant(id: u64, len: u64) -> Grant {
        Grant {
            id,
            slot: 3,
            generation: 7,
            addr: 0x1000,
            key: 42,
            len,
        }
    }

    #[test]
    fn a_granted_message_goes_in_segments_within_the_window() {
        let mut s = Sender::new(1, 10, 2).unwrap();
        let id = s.announce(5, tag(1), 25, 0);
        assert!(s.next_write().is_none(), "nothing may go before the grant");
        s.granted(grant(id, 25)).unwrap();
        let w0 = s.next_write().unwrap();
        let w1 = s.next_write().unwrap();
        assert!(s.next_write().is_none(), "window of 2");
        assert_eq!((w0.offset, w0.len, w0.remote_addr), (0, 10, 0x1000));
        assert_eq!((w1.offset, w1.len, w1.remote_addr), (10, 10, 0x100a));
        let imm = Imm::Message {
            slot: 3,
            generation: 7,
        }
        .encode();
        assert_eq!((w0.imm, w0.key), (imm, 42));
        assert_eq!(s.written(5).unwrap(), None);
        let w2 = s.next_write().unwrap();
        // A full provider queue: the same write comes again.
        assert!(s.unwrite(&w0).is_err(), "not the last write");
        s.unwrite(&w2).unwrap();
        assert_eq!(s.next_write().unwrap(), w2);
        assert_eq!((w2.offset, w2.len), (20, 5));
        assert_eq!(s.written(5).unwrap(), None);
        assert_eq!(s.written(5).unwrap(), Some(5));
        assert!(s.is_idle());
        assert!(s.written(5).is_err());
    }

    #[test]
    fn an_empty_message_is_one_empty_write() {
        let mut s = Sender::new(1, 10, 4).unwrap();
        let id = s.announce(9, tag(1), 0, 0);
        s.granted(grant(id, 0)).unwrap();
        let w = s.next_write().unwrap();
        assert_eq!((w.offset, w.len), (0, 0));
        assert!(s.next_write().is_none());
        assert_eq!(s.written(9).unwrap(), Some(9));
    }

    #[test]
    fn grants_that_do_not_fit_are_refused_naming_the_peer() {
        let mut s = Sender::new(6, 10, 4).unwrap();
        let id = s.announce(1, tag(1), 30, 0);
        let e = s.granted(grant(id + 1, 30)).unwrap_err().to_string();
        assert!(e.contains("rank 6") && e.contains("never made"), "{e}");
        let e = s.granted(grant(id, 31)).unwrap_err().to_string();
        assert!(e.contains("31 bytes") && e.contains("30 bytes"), "{e}");
        s.granted(grant(id, 30)).unwrap();
        assert!(s.granted(grant(id, 30)).is_err(), "granted twice");
    }

    #[test]
    fn a_peer_that_stops_granting_is_named_once_the_timeout_passes() {
        let mut s = Sender::new(2, 10, 4).unwrap();
        let a = s.announce(1, tag(1), 100, 1_000);
        s.announce(2, tag(2), 100, 2_000);
        s.granted(grant(a, 100)).unwrap();
        // The second announcement, made at 2 us, is the oldest waiting.
        s.check(2_000 + 999, 1_000).unwrap();
        let e = s.check(2_000 + 1_000, 1_000).unwrap_err().to_string();
        assert!(e.contains("rank 2") && e.contains("100 bytes"), "{e}");
    }
}
