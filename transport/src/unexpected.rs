//! Frames that arrive before the receive they belong to is posted.
//!
//! Transports deliver straight into posted receives when they can. A frame
//! whose receive is not posted yet is copied here instead of blocking the
//! stream behind it: a stream that stalls on its head frame deadlocks as soon
//! as two ranks post their receives in a different order than the peer sent
//! (a pipelined schedule waiting for segment k+1 to free a slot before posting
//! the receive for the frame in front of it). This is MPI's unexpected-message
//! queue. Buffers are pooled, so a steady state with early arrivals does not
//! allocate.

use crate::error::Result;
use crate::seam::{Rank, Tag};
use crate::wire::FrameHeader;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Pooled buffers kept for reuse at most.
const POOL: usize = 64;

/// Buffers the pools of this process have allocated (see
/// [`early_buffers_allocated`]).
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

/// Early-frame buffers allocated so far, process-wide. The pool grows to the
/// largest number of frames that were ever early at once, which depends on
/// timing (a rank descheduled while its peers send on), not on the step, so
/// a new high can come long after warm-up. The no-allocation test reports
/// these apart from every other allocation.
#[doc(hidden)]
pub fn early_buffers_allocated() -> u64 {
    ALLOCATED.load(Ordering::Relaxed)
}

/// Buffered early frames of one peer, oldest first.
#[derive(Debug)]
pub(crate) struct Unexpected {
    frames: VecDeque<(FrameHeader, Vec<u8>)>,
    pool: Vec<Vec<u8>>,
    /// The largest frame buffered so far. New buffers get this capacity and
    /// smaller ones are not pooled, so every pooled buffer fits any frame:
    /// once the pool holds as many buffers as frames were ever early at
    /// once, buffering allocates nothing, whatever order sizes arrive in.
    frame_cap: usize,
}

impl Default for Unexpected {
    fn default() -> Self {
        Unexpected::new(0)
    }
}

impl Unexpected {
    /// A queue for frames of at most `max_frame` bytes (the transport's
    /// segment size; a larger frame still works, and raises the size).
    /// Sizing every buffer for the largest frame from the start means a
    /// buffer never has to grow, whichever frames happen to arrive early.
    /// Both queues get room for [`POOL`] entries up front (a few KiB), so that
    /// filing and recycling frames never grows them in a steady state; the
    /// buffers themselves come at the first early frame.
    pub fn new(max_frame: usize) -> Self {
        Unexpected {
            frames: VecDeque::with_capacity(POOL),
            pool: Vec::with_capacity(POOL),
            frame_cap: max_frame,
        }
    }

    /// A buffer of `len` bytes for a frame about to be read.
    pub fn buffer(&mut self, len: usize) -> Vec<u8> {
        if len > self.frame_cap {
            self.frame_cap = len;
            self.pool.retain(|b| b.capacity() >= len);
        }
        let cap = self.frame_cap;
        let mut b = self.pool.pop().unwrap_or_else(|| {
            ALLOCATED.fetch_add(1, Ordering::Relaxed);
            Vec::with_capacity(cap)
        });
        // The caller overwrites all `len` bytes: only growth needs filling,
        // a zeroing pass over a reused buffer would be a wasted memory pass.
        if b.len() >= len {
            b.truncate(len);
        } else {
            b.resize(len, 0);
        }
        b
    }

    /// Files a fully read frame.
    pub fn push(&mut self, hdr: FrameHeader, buf: Vec<u8>) {
        self.frames.push_back((hdr, buf));
    }

    /// Copies every buffered segment of the message `tag` (of `len` bytes)
    /// into `dst` and returns how many bytes and frames that was (a zero-length
    /// message is one frame of no bytes). A buffered frame of the
    /// same operation that disagrees with `tag` is a mismatch error.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    pub unsafe fn take(
        &mut self,
        me: Rank,
        tag: &Tag,
        len: usize,
        dst: *mut u8,
    ) -> Result<(usize, usize)> {
        let (mut got, mut frames) = (0, 0);
        let mut i = 0;
        while i < self.frames.len() {
            let (h, _) = &self.frames[i];
            if !tag.matches(me, h, len as u64)? {
                i += 1;
                continue;
            }
            let Some((h, buf)) = self.frames.remove(i) else {
                break;
            };
            // SAFETY: matches() checked h.total == len and decode checked
            // offset + len <= total, so the copy stays within dst's len bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.as_ptr(), dst.add(h.offset as usize), buf.len())
            };
            got += buf.len();
            frames += 1;
            self.recycle(buf);
        }
        Ok((got, frames))
    }

    /// Returns a buffer to the pool (one smaller than the largest frame seen
    /// is dropped instead; see `frame_cap`).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < POOL && buf.capacity() >= self.frame_cap {
            self.pool.push(buf);
        }
    }

    /// Whether no frame is buffered.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Forgets everything (after an abort).
    pub fn clear(&mut self) {
        self.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tags::{self, tag as mk};
    use crate::wire::FrameKind;

    fn frame(
        seq: u64,
        step: u32,
        offset: u64,
        payload: &[u8],
        total: u64,
    ) -> (FrameHeader, Vec<u8>) {
        let h = FrameHeader {
            kind: FrameKind::Data,
            src_rank: 1,
            tag: mk(1, seq, 4, 0, step),
            offset,
            len: payload.len() as u64,
            total,
        };
        (h, payload.to_vec())
    }

    #[test]
    fn segments_of_a_message_reassemble_in_any_order() {
        let mut u = Unexpected::default();
        let (h, b) = frame(7, 2, 4, &[5, 6, 7, 8], 8);
        u.push(h, b);
        let (h, b) = frame(7, 3, 0, &[9; 8], 8); // another step: must stay
        u.push(h, b);
        let (h, b) = frame(7, 2, 0, &[1, 2, 3, 4], 8);
        u.push(h, b);
        let mut dst = [0u8; 8];
        let tag = mk(1, 7, 4, 0, 2);
        let got = unsafe { u.take(0, &tag, 8, dst.as_mut_ptr()) }.unwrap();
        assert_eq!(got, (8, 2));
        assert_eq!(dst, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(u.frames.len(), 1);
    }

    #[test]
    fn a_disagreeing_buffered_frame_is_a_mismatch() {
        let mut u = Unexpected::default();
        let (mut h, b) = frame(7, 0, 0, &[1; 4], 4);
        h.tag.sig = test_tags::sig(99, 0);
        u.push(h, b);
        let tag = mk(1, 7, 4, 0, 0);
        let mut dst = [0u8; 4];
        let e = unsafe { u.take(0, &tag, 4, dst.as_mut_ptr()) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("count=99") && e.contains("count=4"), "{e}");
    }
}
