//! What a verbs rank publishes: the endpoint of the queue pair it made for
//! each peer, in rank order (its own slot empty), so that peer `j` finds
//! the one made for it at slot `j`.

use crate::error::{Error, Result};
use crate::seam::Rank;
use gw_verbs::{ENDPOINT_LEN, QpEndpoint};

/// The published name of a rank whose queue pair for rank `r` is `eps[r]`
/// (`None` for itself).
pub fn encode(eps: &[Option<QpEndpoint>]) -> Vec<u8> {
    let mut out = vec![0u8; eps.len() * ENDPOINT_LEN];
    for (slot, ep) in out.chunks_exact_mut(ENDPOINT_LEN).zip(eps) {
        if let Some(ep) = ep {
            slot.copy_from_slice(&ep.encode());
        }
    }
    out
}

/// The endpoint `peer` made for rank `me`, from `peer`'s published name in
/// a world of `world`; a name of the wrong size or a slot that does not
/// decode is an error naming `peer`.
pub fn endpoint_for(name: &[u8], peer: Rank, me: Rank, world: usize) -> Result<QpEndpoint> {
    if name.len() != world * ENDPOINT_LEN {
        return Err(Error::Config(format!(
            "rank {peer} published a verbs name of {} bytes; a world of {world} needs {} \
             (are all ranks the same gradwire build?)",
            name.len(),
            world * ENDPOINT_LEN
        )));
    }
    let at = me as usize * ENDPOINT_LEN;
    let slot = name
        .get(at..at + ENDPOINT_LEN)
        .ok_or_else(|| Error::Internal(format!("rank {me} is outside a world of {world}")))?;
    QpEndpoint::decode(slot)
        .map_err(|e| Error::Config(format!("rank {peer}'s queue pair for rank {me}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gw_verbs::Mtu;

    fn ep(qpn: u32) -> QpEndpoint {
        QpEndpoint {
            qpn,
            psn: qpn * 3 + 1,
            lid: 7,
            gid: [qpn as u8; 16],
            mtu: Mtu::B4096,
        }
    }

    #[test]
    fn each_peer_finds_the_queue_pair_made_for_it() {
        let world = 5;
        // Rank 2's queue pair for rank r has qpn 100 + r.
        let eps: Vec<Option<QpEndpoint>> = (0..world)
            .map(|r| (r != 2).then(|| ep(100 + r as u32)))
            .collect();
        let name = encode(&eps);
        for me in [0u32, 1, 3, 4] {
            assert_eq!(endpoint_for(&name, 2, me, world).unwrap(), ep(100 + me));
        }
        // Its own slot is empty: nobody may connect to it.
        let e = endpoint_for(&name, 2, 2, world).unwrap_err().to_string();
        assert!(e.contains("rank 2's queue pair for rank 2"), "{e}");
    }

    #[test]
    fn a_name_of_another_world_or_a_spoilt_slot_is_named() {
        let name = encode(&[None, Some(ep(1)), Some(ep(2))]);
        let e = endpoint_for(&name, 0, 1, 4).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 published a verbs name of") && e.contains("world of 4"),
            "{e}"
        );
        let mut bad = name.clone();
        bad[ENDPOINT_LEN] ^= 0xff; // the magic of rank 1's slot
        let e = endpoint_for(&bad, 0, 1, 3).unwrap_err().to_string();
        assert!(e.contains("rank 0's queue pair for rank 1"), "{e}");
        assert!(endpoint_for(&name, 0, 2, 3).is_ok());
    }
}
