//! The per-round handshake of a persistent operation (MiMatrix's GDRAA):
//! buffers registered and their keys exchanged once, then each round costs
//! one small `Ready` message per peer and the data writes themselves.
//!
//! A rank's persistent window is memory its peers write into directly. A
//! peer may write round `r` only once the window's owner has said `Ready(r)`,
//! which it says when it starts round `r`, that is, after it finished
//! reading round `r - 1` out of the window; so writes never overwrite bytes
//! still in use, and no write of a round can arrive before its round began
//! here. The owner counts the chunks that land (each write's immediate names
//! the window, the round mod 256 and the chunk) and its round is complete
//! when every chunk it expects has. Nothing here depends on the message size:
//! the number of control messages per round is the number of peers.
//!
//! [`Inbound`] is the owner's side of one window, [`Outbound`] a writer's
//! view of one peer's window.

use super::imm::MAX_CHUNKS;
use crate::error::{Error, Result};
use crate::seam::Rank;

/// The owner's side of a persistent window: which round it is in and which
/// chunks of it have landed.
#[derive(Debug)]
pub struct Inbound {
    window: u8,
    chunks: usize,
    round: u8,
    running: bool,
    landed: Vec<u64>,
    count: usize,
}

impl Inbound {
    /// Window number `window` of this rank, written in `chunks` chunks per
    /// round (by any of its peers). No round is running yet.
    pub fn new(window: u8, chunks: usize) -> Result<Inbound> {
        if chunks > MAX_CHUNKS {
            return Err(Error::InvalidArgument(format!(
                "a persistent window of {chunks} chunks: at most {MAX_CHUNKS}"
            )));
        }
        Ok(Inbound {
            window,
            chunks,
            round: 0,
            running: false,
            landed: vec![0; chunks.div_ceil(64)],
            count: 0,
        })
    }

    /// Starts the next round; returns its number (mod 256), which the
    /// backend sends to every writer as `Ready`. A round with no chunks is
    /// complete at once.
    pub fn begin(&mut self) -> Result<u8> {
        if self.running {
            return Err(Error::InvalidUsage(format!(
                "persistent window {} started again while round {} has {} of {} chunks",
                self.window, self.round, self.count, self.chunks
            )));
        }
        self.round = self.round.wrapping_add(1);
        self.landed.iter_mut().for_each(|w| *w = 0);
        self.count = 0;
        self.running = self.chunks > 0;
        Ok(self.round)
    }

    /// A write from `peer` landed, naming `round` and `chunk`: whether the
    /// round is now complete.
    pub fn landed(&mut self, peer: Rank, round: u8, chunk: u16) -> Result<bool> {
        let w = self.window;
        if !self.running || round != self.round {
            return Err(Error::Protocol(format!(
                "rank {peer} wrote chunk {chunk} of round {round} into persistent window {w}, which is {} round {} (a write before its Ready, or a lost round)",
                if self.running { "in" } else { "done with" },
                self.round
            )));
        }
        let c = chunk as usize;
        if c >= self.chunks {
            return Err(Error::Protocol(format!(
                "rank {peer} wrote chunk {chunk} into persistent window {w}, which has {} chunks a round",
                self.chunks
            )));
        }
        let bit = 1u64 << (c % 64);
        if self.landed[c / 64] & bit != 0 {
            return Err(Error::Protocol(format!(
                "rank {peer} wrote chunk {chunk} of round {round} into persistent window {w} twice"
            )));
        }
        self.landed[c / 64] |= bit;
        self.count += 1;
        if self.count == self.chunks {
            self.running = false;
        }
        Ok(!self.running)
    }

    /// Whether the current round has all its chunks.
    pub fn is_complete(&self) -> bool {
        !self.running
    }

    /// The current round (mod 256).
    pub fn round(&self) -> u8 {
        self.round
    }
}

/// A writer's view of one peer's window: the latest round the peer said it
/// is ready for.
#[derive(Debug)]
pub struct Outbound {
    peer: Rank,
    window: u8,
    ready: Option<u8>,
}

impl Outbound {
    pub fn new(peer: Rank, window: u8) -> Outbound {
        Outbound {
            peer,
            window,
            ready: None,
        }
    }

    /// The peer said `Ready(round)`. Rounds come one at a time and in order:
    /// anything else is the peer's protocol error.
    pub fn ready(&mut self, round: u8) -> Result<()> {
        let next = self.ready.map_or(1, |r| r.wrapping_add(1));
        if round != next {
            return Err(Error::Protocol(format!(
                "rank {} said it is ready for round {round} of persistent window {}, expected round {next}",
                self.peer, self.window
            )));
        }
        self.ready = Some(round);
        Ok(())
    }

    /// Whether round `round` may be written into the peer's window.
    pub fn may_write(&self, round: u8) -> bool {
        self.ready == Some(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_completes_when_every_chunk_has_landed_in_any_order() {
        let mut w = Inbound::new(2, 130).unwrap();
        for _ in 0..300 {
            let r = w.begin().unwrap();
            for c in (0..130u16).rev() {
                assert_eq!(w.landed(1, r, c).unwrap(), c == 0);
            }
            assert!(w.is_complete());
        }
        assert_eq!(w.round(), (300 % 256) as u8);
    }

    #[test]
    fn early_late_duplicate_and_unknown_chunks_are_refused() {
        let mut w = Inbound::new(0, 2).unwrap();
        let e = w.landed(3, 1, 0).unwrap_err().to_string();
        assert!(
            e.contains("rank 3") && e.contains("before its Ready"),
            "{e}"
        );
        let r = w.begin().unwrap();
        assert!(w.begin().is_err(), "started while running");
        assert!(!w.landed(3, r, 1).unwrap());
        assert!(w.landed(3, r, 1).unwrap_err().to_string().contains("twice"));
        assert!(
            w.landed(3, r, 2)
                .unwrap_err()
                .to_string()
                .contains("2 chunks")
        );
        assert!(w.landed(3, r.wrapping_add(1), 0).is_err());
        assert!(w.landed(3, r, 0).unwrap());
        assert!(w.landed(3, r, 0).is_err(), "round over");
        assert!(Inbound::new(0, MAX_CHUNKS + 1).is_err());
        let mut empty = Inbound::new(1, 0).unwrap();
        empty.begin().unwrap();
        assert!(empty.is_complete());
    }

    #[test]
    fn writers_wait_for_ready_in_order() {
        let mut o = Outbound::new(5, 1);
        assert!(!o.may_write(1));
        o.ready(1).unwrap();
        assert!(o.may_write(1) && !o.may_write(2));
        let e = o.ready(3).unwrap_err().to_string();
        assert!(
            e.contains("rank 5") && e.contains("expected round 2"),
            "{e}"
        );
        for r in 2..=600u32 {
            o.ready(r as u8).unwrap();
        }
        assert!(o.may_write((600 % 256) as u8));
    }
}
