//! All-to-all: every rank sends its own block to every other rank
//! (`MPI_Alltoallv`, PyTorch's `all_to_all_single`, mixture-of-experts
//! dispatch).
//!
//! It runs as n − 1 rounds of one send/receive operation each: round k sends
//! to rank + k and receives from rank − k (mod n). Every round's operation
//! has both halves, so no two ranks ever wait on each other's send whatever
//! the block sizes, and each pair's messages stay numbered alike on both
//! sides. The rank's own block is copied locally. Blocks may be empty and of
//! different sizes per peer (the receive side must expect what the peer
//! sends: a difference is an error on the receiving rank).

use crate::communicator::Communicator;
use crate::op::DType;
use gw_transport::{Error, Result};

/// Element offsets and counts of one side of an all-to-all, checked.
fn blocks(what: &str, counts: &[usize], displs: &[usize], n: usize) -> Result<usize> {
    if counts.len() != n || displs.len() != n {
        return Err(Error::InvalidArgument(format!(
            "all_to_all: {} {what} counts and {} displacements for {n} ranks",
            counts.len(),
            displs.len()
        )));
    }
    let mut end = 0usize;
    for (i, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        let e = d.checked_add(c).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "all_to_all: {what} block {i} (displacement {d}, count {c}) overflows"
            ))
        })?;
        end = end.max(e);
    }
    Ok(end)
}

impl Communicator {
    /// Sends `send_counts[p]` elements at element offset `send_displs[p]` of
    /// `send` to each rank p, and receives `recv_counts[p]` elements from
    /// each rank p at offset `recv_displs[p]` of `recv` (see the module
    /// comment). Blocks until done. Collective: every rank calls it, and
    /// what rank p sends to rank q is what q expects from p.
    ///
    /// # Safety
    /// `send` must be readable and `recv` writable for every block the
    /// counts and displacements describe, the two must not overlap, and
    /// both must stay valid until this returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv_raw(
        &self,
        dtype: DType,
        send: *const u8,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: *mut u8,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let n = self.size() as usize;
        let me = self.rank() as usize;
        let es = dtype.size();
        let send_end = blocks("send", send_counts, send_displs, n)?;
        let recv_end = blocks("receive", recv_counts, recv_displs, n)?;
        if send_end.checked_mul(es).is_none() || recv_end.checked_mul(es).is_none() {
            return Err(Error::InvalidArgument(
                "all_to_all: the buffers' sizes overflow".into(),
            ));
        }
        if (send.is_null() && send_end > 0) || (recv.is_null() && recv_end > 0) {
            return Err(Error::InvalidArgument(
                "all_to_all: a NULL buffer with elements to move".into(),
            ));
        }
        if send_counts[me] != recv_counts[me] {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: rank {me} sends itself {} elements but expects {}",
                send_counts[me], recv_counts[me]
            )));
        }
        if send_end > 0
            && recv_end > 0
            && (send as usize) < recv as usize + recv_end * es
            && (recv as usize) < send as usize + send_end * es
        {
            return Err(Error::InvalidArgument(
                "all_to_all: the send and receive buffers overlap (in place is not supported)"
                    .into(),
            ));
        }
        // SAFETY (all pointer arithmetic and copies below): the caller
        // promised the blocks are valid; offsets were checked not to overflow.
        // The own block is a local copy like any other layer's: it goes
        // around `rep movsb` where its ends meet just past each other.
        if send_counts[me] > 0 {
            unsafe {
                gw_transport::copy_bytes(
                    recv.add(recv_displs[me] * es),
                    send.add(send_displs[me] * es),
                    send_counts[me] * es,
                );
            }
        }
        for k in 1..n {
            let to = (me + k) % n;
            let from = (me + n - k) % n;
            let h = unsafe {
                self.sendrecv_raw(
                    dtype,
                    Some((to as u32, send.add(send_displs[to] * es), send_counts[to])),
                    Some((
                        from as u32,
                        recv.add(recv_displs[from] * es),
                        recv_counts[from],
                    )),
                )
            }?;
            h.wait()?;
        }
        Ok(())
    }

    /// Equal blocks: `send` holds `size()` blocks of `send.len() / size()`
    /// elements, block p going to rank p; `recv` receives block q from rank q.
    pub fn all_to_all<T: crate::Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = self.size() as usize;
        if send.len() != recv.len() || !send.len().is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: send has {} elements and recv {}: both must be {n} equal blocks",
                send.len(),
                recv.len()
            )));
        }
        let c = send.len() / n;
        let counts = vec![c; n];
        let displs: Vec<usize> = (0..n).map(|p| p * c).collect();
        // SAFETY: both slices hold n blocks of c elements, and are distinct
        // (one is borrowed mutably); the call blocks until done.
        unsafe {
            self.all_to_allv_raw(
                T::DTYPE,
                send.as_ptr().cast(),
                &counts,
                &displs,
                recv.as_mut_ptr().cast(),
                &counts,
                &displs,
            )
        }
    }
}
