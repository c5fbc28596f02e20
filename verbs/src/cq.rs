//! Completion queues, and the channel that lets a poller sleep on them.
//!
//! gradwire's engine sleeps in one `mio::Poll` for every transport, so the
//! verbs backend cannot block in `ibv_get_cq_event`. A [`CompChannel`] is
//! made non-blocking and exposes its descriptor ([`AsRawFd`]) for the
//! engine's poller (`mio::unix::SourceFd`). The sleep protocol is verbs'
//! usual one, split across the poller: [`CompletionQueue::arm`]
//! (`ibv_req_notify_cq`) before sleeping, then poll the queue once more
//! (a completion that arrived before arming raises no event); when the
//! descriptor is readable, [`CompChannel::drain`] reads and acknowledges
//! the events, and the caller arms and polls again.

use crate::completion::{Completion, RawWc};
use crate::device::{Context, Hca};
use crate::error::{Errno, Error, Result};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

pub(crate) struct Channel {
    ch: *mut rdma_sys::ibv_comp_channel,
    ctx: Arc<Context>,
}

// SAFETY: a completion channel may be read from any thread; libibverbs is
// thread-safe and this wrapper hands out no reference into the C struct.
unsafe impl Send for Channel {}
// SAFETY: as for Send.
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: ch came from ibv_create_comp_channel, and every CQ using it
        // holds an Arc of this Channel, so none is left.
        let rc = unsafe { rdma_sys::ibv_destroy_comp_channel(self.ch) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name, "ibv_destroy_comp_channel failed: {}", crate::sys::rc_errno(rc));
        }
    }
}

/// A completion channel: one descriptor that becomes readable when an
/// armed completion queue attached to it gets a completion.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<Channel>,
}

impl Hca {
    /// Creates a completion channel with a non-blocking descriptor.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        // SAFETY: the context is open.
        let ch = unsafe { rdma_sys::ibv_create_comp_channel(self.ctx.ctx) };
        if ch.is_null() {
            return Err(Error::CreateCompChannel {
                call: "ibv_create_comp_channel",
                errno: Errno::last(),
            });
        }
        let inner = Arc::new(Channel {
            ch,
            ctx: self.ctx.clone(),
        });
        // SAFETY: ch is a valid channel; reading its fd field.
        let fd = unsafe { (*ch).fd };
        // SAFETY: fcntl on a descriptor this channel owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::CreateCompChannel {
                call: "fcntl(O_NONBLOCK) on the completion channel",
                errno: Errno::last(),
            });
        }
        Ok(CompChannel { inner })
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is alive while self is.
        unsafe { (*self.inner.ch).fd }
    }
}

impl CompChannel {
    /// Reads and acknowledges every event waiting on the channel; returns
    /// how many there were (0 when the descriptor was not readable). The
    /// queues that raised them are disarmed until armed again.
    pub fn drain(&self) -> Result<u32> {
        let mut n = 0;
        loop {
            let mut cq: *mut rdma_sys::ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: the channel is alive and non-blocking; cq and cq_ctx
            // are valid out-pointers.
            let rc = unsafe { rdma_sys::ibv_get_cq_event(self.inner.ch, &mut cq, &mut cq_ctx) };
            if rc != 0 {
                let errno = Errno::last();
                if errno.0 == libc::EAGAIN || errno.0 == libc::EWOULDBLOCK {
                    return Ok(n);
                }
                return Err(Error::Notify {
                    call: "ibv_get_cq_event",
                    errno,
                });
            }
            // SAFETY: cq is the queue the event came from; it is alive, since
            // a CQ is destroyed only by its owner's thread, which is here.
            // Acknowledging at once keeps ibv_destroy_cq from waiting.
            unsafe { rdma_sys::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

pub(crate) struct Cq {
    pub(crate) cq: *mut rdma_sys::ibv_cq,
    ctx: Arc<Context>,
    _channel: Option<Arc<Channel>>,
}

// SAFETY: completion queues may be polled and armed from any thread
// (libibverbs is thread-safe); no reference into the C struct escapes.
unsafe impl Send for Cq {}
// SAFETY: as for Send.
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: cq came from ibv_create_cq; every QP using it holds an Arc
        // of this Cq, so none is left, and events are acknowledged as they
        // are read.
        let rc = unsafe { rdma_sys::ibv_destroy_cq(self.cq) };
        if rc != 0 {
            tracing::warn!(device = %self.ctx.name, "ibv_destroy_cq failed: {}", crate::sys::rc_errno(rc));
        }
    }
}

/// A completion queue.
pub struct CompletionQueue {
    pub(crate) inner: Arc<Cq>,
    depth: u32,
}

/// Completions read from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

impl Hca {
    /// Creates a completion queue of at least `depth` entries, attached to
    /// `channel` if given (so that [`CompletionQueue::arm`] can wake it).
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<CompletionQueue> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.inner.ch);
        let cqe = i32::try_from(depth).map_err(|_| {
            Error::InvalidArgument(format!("a completion queue of {depth} entries is too deep"))
        })?;
        // SAFETY: the context is open; ch is NULL or a live channel of it.
        let cq = unsafe { rdma_sys::ibv_create_cq(self.ctx.ctx, cqe, std::ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            return Err(Error::CreateCq {
                call: "ibv_create_cq",
                depth,
                errno: Errno::last(),
            });
        }
        Ok(CompletionQueue {
            inner: Arc::new(Cq {
                cq,
                ctx: self.ctx.clone(),
                _channel: channel.map(|c| c.inner.clone()),
            }),
            depth,
        })
    }
}

impl CompletionQueue {
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Asks for an event on the channel at the next completion
    /// (`ibv_req_notify_cq`). Poll once more after arming.
    pub fn arm(&self) -> Result<()> {
        // SAFETY: the queue is alive.
        let rc = unsafe { rdma_sys::ibv_req_notify_cq(self.inner.cq, 0) };
        if rc != 0 {
            return Err(Error::Notify {
                call: "ibv_req_notify_cq",
                errno: crate::sys::rc_errno(rc),
            });
        }
        Ok(())
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    /// Failed completions are returned like the others (see
    /// [`Completion::ok`]), so that the caller learns which request failed.
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            let mut wc: [MaybeUninit<rdma_sys::ibv_wc>; POLL_BATCH] =
                [const { MaybeUninit::uninit() }; POLL_BATCH];
            // SAFETY: the queue is alive and wc has room for `want` entries.
            let n = unsafe {
                rdma_sys::ibv_poll_cq(self.inner.cq, want as i32, wc.as_mut_ptr().cast())
            };
            if n < 0 {
                return Err(Error::PollCq {
                    call: "ibv_poll_cq",
                    errno: crate::sys::rc_errno(n),
                });
            }
            let n = n as usize;
            for (slot, w) in out[done..].iter_mut().zip(&wc[..n]) {
                // SAFETY: ibv_poll_cq filled the first n entries.
                let w = unsafe { w.assume_init_ref() };
                *slot = Completion::from_raw(&RawWc {
                    wr_id: w.wr_id,
                    status: w.status,
                    opcode: w.opcode,
                    byte_len: w.byte_len,
                    wc_flags: w.wc_flags,
                    // SAFETY: both union members are a plain u32; which one
                    // is meant is what wc_flags says, checked by from_raw.
                    imm_be: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
                    vendor_err: w.vendor_err,
                    qp_num: w.qp_num,
                });
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }
}
