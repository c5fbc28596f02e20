//! Completions from a verbs queue as the driver takes them: good ones in
//! order, an error only once the good ones before it are taken, and the
//! checks on what a peer's grant says. Pure (gw-verbs' `Completion` is
//! plain data), so it is tested on any machine.

use crate::nic::{Cqe, NicError, RemoteAt};
use crate::seam::Rank;
use gw_verbs::{Completion, Opcode};
use std::collections::VecDeque;

/// The driver's view of a good completion: a receive that an RDMA WRITE
/// WITH IMM consumed carries the immediate; every other one its context.
pub fn cqe(c: &Completion) -> Cqe {
    Cqe {
        ctx: Some(c.wr_id),
        imm: match c.opcode {
            Opcode::RecvRdmaWithImm => c.imm.map(u64::from),
            _ => None,
        },
        len: c.byte_len as usize,
    }
}

/// Moves completions from `stash` into `out`: good ones in order; a failed
/// one is returned as [`NicError::Completion`] (its work request's context
/// and the status in words) only when it is first, so the good ones read
/// with it are never lost.
pub fn take(stash: &mut VecDeque<Completion>, out: &mut [Cqe]) -> Result<usize, NicError> {
    let mut n = 0;
    while n < out.len() {
        let Some(c) = stash.front().copied() else {
            break;
        };
        if !c.is_ok() {
            if n > 0 {
                break;
            }
            stash.pop_front();
            let text = match c.ok() {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            };
            return Err(NicError::Completion {
                ctx: Some(c.wr_id),
                text,
            });
        }
        stash.pop_front();
        out[n] = cqe(&c);
        n += 1;
    }
    Ok(n)
}

/// The key of a one-sided operation's far end, checked: verbs keys are 32
/// bits, and a wider one can only come from a peer not speaking verbs.
pub fn rkey(to: &RemoteAt<Rank>) -> Result<u32, NicError> {
    u32::try_from(to.key).map_err(|_| {
        NicError::Other(format!(
            "rank {} named a region key {:#x}, wider than verbs' 32 bits",
            to.peer, to.key
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gw_verbs::completion::code::{
        RECV as WC_RECV, RECV_RDMA_WITH_IMM as WC_RECV_RDMA_WITH_IMM, SEND as WC_SEND,
    };
    use gw_verbs::completion::{RawWc, WC_WITH_IMM};
    use gw_verbs::status::code;

    fn wc(wr_id: u64, opcode: u32, status: u32, imm: Option<u32>) -> Completion {
        Completion::from_raw(&RawWc {
            wr_id,
            status,
            opcode,
            byte_len: 40,
            wc_flags: if imm.is_some() { WC_WITH_IMM } else { 0 },
            imm_be: imm.unwrap_or(0).to_be(),
            vendor_err: 0x81,
            qp_num: 0x1234,
        })
    }

    #[test]
    fn an_immediate_is_the_receive_it_consumed() {
        let c = cqe(&wc(
            7,
            WC_RECV_RDMA_WITH_IMM,
            code::SUCCESS,
            Some(0xdead_beef),
        ));
        assert_eq!(
            c,
            Cqe {
                ctx: Some(7),
                imm: Some(0xdead_beef),
                len: 40
            }
        );
        // A plain receive's bytes are a frame, never an immediate.
        assert_eq!(cqe(&wc(8, WC_RECV, code::SUCCESS, None)).imm, None);
        assert_eq!(cqe(&wc(9, WC_SEND, code::SUCCESS, None)).ctx, Some(9));
    }

    #[test]
    fn an_error_waits_until_the_good_completions_before_it_are_taken() {
        let mut stash: VecDeque<Completion> = [
            wc(1, WC_SEND, code::SUCCESS, None),
            wc(2, WC_RECV, code::SUCCESS, None),
            wc(3, WC_SEND, code::RETRY_EXC_ERR, None),
            wc(4, WC_SEND, code::WR_FLUSH_ERR, None),
            wc(5, WC_RECV, code::SUCCESS, None),
        ]
        .into();
        let mut out = [Cqe::default(); 8];
        assert_eq!(take(&mut stash, &mut out).unwrap(), 2);
        assert_eq!((out[0].ctx, out[1].ctx), (Some(1), Some(2)));
        let e = take(&mut stash, &mut out).unwrap_err();
        let NicError::Completion { ctx, text } = e else {
            panic!("{e:?}")
        };
        assert_eq!(ctx, Some(3));
        // The status in words, with what to check.
        assert!(text.contains("work request 3 failed"), "{text}");
        assert!(text.to_lowercase().contains("retry"), "{text}");
        assert!(matches!(
            take(&mut stash, &mut out),
            Err(NicError::Completion { ctx: Some(4), .. })
        ));
        assert_eq!(take(&mut stash, &mut out).unwrap(), 1);
        assert_eq!(out[0].ctx, Some(5));
        assert_eq!(take(&mut stash, &mut out).unwrap(), 0);
    }

    #[test]
    fn take_stops_at_the_room_given() {
        let mut stash: VecDeque<Completion> = (0..5)
            .map(|i| wc(i, WC_SEND, code::SUCCESS, None))
            .collect();
        let mut out = [Cqe::default(); 3];
        assert_eq!(take(&mut stash, &mut out).unwrap(), 3);
        assert_eq!(stash.len(), 2);
        assert_eq!(take(&mut stash, &mut out).unwrap(), 2);
        assert_eq!(out[1].ctx, Some(4));
    }

    #[test]
    fn a_key_wider_than_32_bits_is_refused_naming_the_peer() {
        let ok = rkey(&RemoteAt {
            peer: 3,
            addr: 0x1000,
            key: 0xffff_ffff,
        })
        .unwrap();
        assert_eq!(ok, 0xffff_ffff);
        let e = rkey(&RemoteAt {
            peer: 3,
            addr: 0,
            key: 1 << 32,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("rank 3") && e.contains("32 bits"), "{e}");
    }
}
