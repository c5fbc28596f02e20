//! What a verbs rank publishes: its port's path once (an endpoint of
//! `gw-verbs`' codec: LID, GID, MTU), then, in rank order, the queue pair
//! number and first packet sequence number of the queue pair it made for
//! each peer (8 bytes each, its own slot zero), so that peer `j` finds the
//! one made for it at slot `j`. Every rank reads every record at
//! rendezvous, so a record stays small: 32 + 8 × world bytes.

use crate::error::{Error, Result};
use crate::seam::Rank;
use gw_verbs::endpoint::MAX_24;
use gw_verbs::{ENDPOINT_LEN, QpEndpoint};

/// Bytes per peer: queue pair number and packet sequence number.
const SLOT: usize = 8;

/// The published name of a rank whose queue pair for rank `r` is `eps[r]`
/// (`None` for itself). All its queue pairs share one port, so the first
/// one's path stands for all.
pub fn encode(eps: &[Option<QpEndpoint>]) -> Vec<u8> {
    let mut out = vec![0u8; ENDPOINT_LEN + eps.len() * SLOT];
    if let Some(first) = eps.iter().flatten().next() {
        out[..ENDPOINT_LEN].copy_from_slice(&first.encode());
    }
    for (slot, ep) in out[ENDPOINT_LEN..].chunks_exact_mut(SLOT).zip(eps) {
        if let Some(ep) = ep {
            slot[..4].copy_from_slice(&ep.qpn.to_le_bytes());
            slot[4..].copy_from_slice(&ep.psn.to_le_bytes());
        }
    }
    out
}

/// The endpoint `peer` made for rank `me`, from `peer`'s published name in
/// a world of `world`; a name of the wrong size, a path that does not
/// decode or an empty or malformed slot is an error naming `peer`.
pub fn endpoint_for(name: &[u8], peer: Rank, me: Rank, world: usize) -> Result<QpEndpoint> {
    let want = ENDPOINT_LEN + world * SLOT;
    if name.len() != want {
        return Err(Error::Config(format!(
            "rank {peer} published a verbs name of {} bytes; a world of {world} needs {want} \
             (are all ranks the same gradwire build?)",
            name.len()
        )));
    }
    let bad = |why: String| Error::Config(format!("rank {peer}'s queue pair for rank {me}: {why}"));
    let path = QpEndpoint::decode(&name[..ENDPOINT_LEN]).map_err(|e| bad(e.to_string()))?;
    let at = ENDPOINT_LEN + me as usize * SLOT;
    let slot = name
        .get(at..at + SLOT)
        .ok_or_else(|| Error::Internal(format!("rank {me} is outside a world of {world}")))?;
    let word = |i: usize| u32::from_le_bytes([slot[i], slot[i + 1], slot[i + 2], slot[i + 3]]);
    let (qpn, psn) = (word(0), word(4));
    if qpn == 0 {
        return Err(bad(
            "none was made (queue pair 0 is never a connection's)".into()
        ));
    }
    if qpn > MAX_24 || psn > MAX_24 {
        return Err(bad(format!(
            "queue pair {qpn:#x} and packet sequence number {psn:#x} must fit 24 bits"
        )));
    }
    Ok(QpEndpoint { qpn, psn, ..path })
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
            gid: [9; 16],
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
        assert_eq!(name.len(), ENDPOINT_LEN + 8 * world);
        for me in [0u32, 1, 3, 4] {
            assert_eq!(endpoint_for(&name, 2, me, world).unwrap(), ep(100 + me));
        }
        // Its own slot is empty: nobody may connect to it.
        let e = endpoint_for(&name, 2, 2, world).unwrap_err().to_string();
        assert!(
            e.contains("rank 2's queue pair for rank 2: none was made"),
            "{e}"
        );
    }

    #[test]
    fn a_name_of_another_world_or_a_spoilt_path_or_slot_is_named() {
        let name = encode(&[None, Some(ep(1)), Some(ep(2))]);
        let e = endpoint_for(&name, 0, 1, 4).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 published a verbs name of") && e.contains("world of 4"),
            "{e}"
        );
        let mut bad = name.clone();
        bad[0] ^= 0xff; // the path's magic
        let e = endpoint_for(&bad, 0, 1, 3).unwrap_err().to_string();
        assert!(
            e.contains("rank 0's queue pair for rank 1") && e.contains("magic"),
            "{e}"
        );
        let mut bad = name.clone();
        bad[ENDPOINT_LEN + 8 + 3] = 0x7f; // rank 1's qpn past 24 bits
        let e = endpoint_for(&bad, 0, 1, 3).unwrap_err().to_string();
        assert!(e.contains("24 bits"), "{e}");
        assert_eq!(endpoint_for(&name, 0, 2, 3).unwrap(), ep(2));
    }
}
