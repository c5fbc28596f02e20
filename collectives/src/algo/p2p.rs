//! Point-to-point transfers as a schedule of at most one send and one
//! receive, so that send/recv run through the same engine path (fingerprints,
//! deadlines, abort) as collectives. Posting both halves of a `sendrecv` in
//! one operation is what lets two ranks exchange large messages without
//! deadlocking on each other's send.

use super::{Action, ActionId, Buf, Loc, Schedule};
use gw_transport::Rank;

/// One direction of a transfer: the peer, the pair-wise message number, elements.
#[derive(Clone, Copy, Debug)]
pub struct Half {
    pub peer: Rank,
    pub step: u32,
    pub count: usize,
}

/// A send from `Buf::Send`, a receive into `Buf::Recv`, or both. It holds
/// only its two halves and makes their actions when asked, so that a
/// message's schedule allocates nothing and stays small (the engine runs it
/// by value; see `RunSched` there).
pub struct P2p {
    /// Halves not yet handed out, as actions: the send goes first.
    send_due: bool,
    recv_due: bool,
    outstanding: usize,
    send: Option<Half>,
    recv: Option<Half>,
}

impl P2p {
    pub fn new(send: Option<Half>, recv: Option<Half>) -> P2p {
        P2p {
            send_due: send.is_some(),
            recv_due: recv.is_some(),
            outstanding: usize::from(send.is_some()) + usize::from(recv.is_some()),
            send,
            recv,
        }
    }
}

impl Schedule for P2p {
    fn next_action(&mut self) -> Option<Action> {
        if self.send_due {
            self.send_due = false;
            let h = self.send?;
            return Some(Action::Send {
                id: 0,
                peer: h.peer,
                step: h.step,
                src: Loc::new(Buf::Send, 0, h.count),
            });
        }
        if self.recv_due {
            self.recv_due = false;
            let h = self.recv?;
            return Some(Action::Recv {
                id: 1,
                peer: h.peer,
                step: h.step,
                dst: Loc::new(Buf::Recv, 0, h.count),
            });
        }
        None
    }

    fn complete(&mut self, _id: ActionId) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    fn is_done(&self) -> bool {
        self.outstanding == 0
    }

    fn scratch_elems(&self) -> usize {
        0
    }

    fn exchanges_with(&self, peer: Rank) -> bool {
        self.send.is_some_and(|h| h.peer == peer) && self.recv.is_some_and(|h| h.peer == peer)
    }

    fn waiting_for(&self) -> String {
        let recv = self
            .recv
            .map(|h| format!("recv of message {} from rank {}", h.step, h.peer));
        let send = self
            .send
            .map(|h| format!("send of message {} to rank {}", h.step, h.peer));
        let desc: Vec<String> = recv.into_iter().chain(send).collect();
        format!("waiting for {}", desc.join(" and "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_goes_out_before_the_receive_and_both_must_finish() {
        let h = |peer, step| Half {
            peer,
            step,
            count: 4,
        };
        let mut both = P2p::new(Some(h(1, 7)), Some(h(2, 3)));
        assert!(matches!(
            both.next_action(),
            Some(Action::Send {
                id: 0,
                peer: 1,
                step: 7,
                ..
            })
        ));
        assert!(matches!(
            both.next_action(),
            Some(Action::Recv {
                id: 1,
                peer: 2,
                step: 3,
                ..
            })
        ));
        assert_eq!(both.next_action(), None);
        both.complete(0);
        assert!(!both.is_done());
        both.complete(1);
        assert!(both.is_done());
        let mut recv = P2p::new(None, Some(h(2, 0)));
        assert!(matches!(recv.next_action(), Some(Action::Recv { .. })));
        assert_eq!(recv.next_action(), None);
        assert!(!recv.is_done());
        recv.complete(1);
        assert!(recv.is_done());
        let mut none = P2p::new(None, None);
        assert_eq!(none.next_action(), None);
        assert!(none.is_done());
    }

    #[test]
    fn a_stalled_transfer_names_its_halves() {
        let h = |peer, step| Half {
            peer,
            step,
            count: 4,
        };
        let both = P2p::new(Some(h(1, 7)), Some(h(2, 3)));
        assert_eq!(
            both.waiting_for(),
            "waiting for recv of message 3 from rank 2 and send of message 7 to rank 1"
        );
        let send = P2p::new(Some(h(1, 0)), None);
        assert_eq!(
            send.waiting_for(),
            "waiting for send of message 0 to rank 1"
        );
    }

    #[test]
    fn only_both_halves_with_one_peer_are_an_exchange() {
        let h = |peer| Half {
            peer,
            step: 0,
            count: 4,
        };
        assert!(P2p::new(Some(h(1)), Some(h(1))).exchanges_with(1));
        assert!(!P2p::new(Some(h(1)), Some(h(1))).exchanges_with(2));
        assert!(!P2p::new(Some(h(1)), Some(h(2))).exchanges_with(1));
        assert!(!P2p::new(Some(h(1)), None).exchanges_with(1));
        assert!(!P2p::new(None, Some(h(1))).exchanges_with(1));
    }
}
