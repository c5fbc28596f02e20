//! One TCP socket between two ranks, and the framing state on each direction.
//!
//! A lane carries a stream of `[64-byte header][payload]` frames. The send
//! side writes queued segments with `writev` straight from registered memory.
//! The receive side reads a header, then reads the payload straight into the
//! matching posted receive (zero-copy); a frame that arrives before its
//! receive is posted waits one progress call ([`Rx::Parked`]), then is read
//! into one of the receive core's early buffers (see `recv_core`).
//! Small reads (a header, a small payload) also pull whatever follows into
//! the lane's [`Stage`], so a small frame costs one `read` rather than two.

use crate::seam::MemPtr;
use crate::wire::{FrameHeader, HEADER_LEN};
use std::collections::VecDeque;
use std::io::{self, IoSliceMut, Read};

/// One segment waiting to be written.
pub(crate) struct OutSeg {
    pub req: u64,
    pub hdr: [u8; HEADER_LEN],
    pub ptr: MemPtr,
    pub len: usize,
    /// Bytes of header plus payload already written.
    pub done: usize,
    /// The credits owed to the peer were written into the header.
    pub stamped: bool,
    /// The payload itself, written instead of `len` bytes at `ptr`: the
    /// rest of a message whose caller took its buffer back at once
    /// (`Transport::send_now`, which the socket did not take whole).
    pub keep: Option<Box<[u8]>>,
}

/// Where the receive side of a lane is in the frame stream.
pub(crate) enum Rx {
    /// Reading a header; `got` bytes of it so far.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Reading a payload into a posted receive.
    Payload {
        hdr: FrameHeader,
        req: u64,
        dst: MemPtr,
        got: usize,
    },
    /// Reading a one-sided write's payload (`FrameKind::Put`) straight into
    /// this rank's published region; its immediate is delivered once whole.
    Put {
        hdr: FrameHeader,
        dst: MemPtr,
        got: usize,
    },
    /// Reading the bytes of one of this rank's one-sided reads (a
    /// `FrameKind::Fetched` frame) into its destination; request `req`
    /// completes once they are whole.
    Fetched {
        hdr: FrameHeader,
        req: u64,
        dst: MemPtr,
        got: usize,
    },
    /// Reading the reason text of an abort frame.
    Abort { hdr: FrameHeader, buf: Vec<u8> },
    /// A frame whose receive was not posted when its header came in. Its
    /// payload stays in the socket until the next progress call: the engine
    /// runs in between and usually posts that receive (the read loop takes
    /// in every frame the socket holds, often ahead of the schedule, which
    /// posts receives as the ones before them complete). Still unposted
    /// then, the frame is read as [`Rx::Early`]; waiting longer could
    /// deadlock a schedule that needs a frame queued behind this one.
    Parked { hdr: FrameHeader },
    /// Reading a frame whose receive is not posted yet into early buffer
    /// `buf` of the receive core.
    Early {
        hdr: FrameHeader,
        buf: usize,
        got: usize,
    },
}

impl Rx {
    pub fn new() -> Rx {
        Rx::Header {
            buf: [0; HEADER_LEN],
            got: 0,
        }
    }

    /// Between frames: nothing of the next one read yet.
    pub fn at_frame_start(&self) -> bool {
        matches!(self, Rx::Header { got: 0, .. })
    }
}

/// Bytes read from a lane's socket ahead of the frame being parsed.
///
/// A read of fewer than `STAGE_LEN` bytes is a `readv` that also fills the
/// stage, and later reads are served from the stage first. Larger reads go
/// straight into their destination (the zero-copy payload path).
pub(crate) struct Stage {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Whether small reads pull ahead: off while the lane carries large
    /// frames, whose payload would only be copied out of the stage again.
    pub ahead: bool,
    /// The last read from the socket returned less than it asked for: the
    /// socket had nothing more then, so trying again at once would only
    /// return `EAGAIN` (a system call on the path of every small message).
    pub drained: bool,
}

/// Big enough for a header and a small message's payload; reading ahead into
/// it costs a copy that is cheap next to the `read` it saves.
pub(crate) const STAGE_LEN: usize = 16 * 1024;

impl Stage {
    pub fn new() -> Stage {
        Stage {
            buf: vec![0; STAGE_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            ahead: true,
            drained: false,
        }
    }

    /// Whether bytes wait here (the lane has input even if its socket has none).
    pub fn pending(&self) -> bool {
        self.start < self.end
    }

    /// How many bytes wait here.
    pub fn staged(&self) -> usize {
        self.end - self.start
    }

    /// Reads into `dst` (non-empty): staged bytes first, else from `sock`.
    /// `Ok(0)` means the peer closed the connection.
    pub fn read(&mut self, sock: &mut impl Read, dst: &mut [u8]) -> io::Result<usize> {
        if self.pending() {
            let n = (self.end - self.start).min(dst.len());
            dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        if dst.len() >= STAGE_LEN || !self.ahead {
            let n = sock.read(dst)?;
            self.drained = n < dst.len();
            return Ok(n);
        }
        let want = dst.len();
        let n = sock.read_vectored(&mut [IoSliceMut::new(dst), IoSliceMut::new(&mut self.buf)])?;
        self.drained = n < want + self.buf.len();
        if n > want {
            self.start = 0;
            self.end = n - want;
            return Ok(want);
        }
        Ok(n)
    }
}

/// Segments a lane's queue holds before it grows.
const SENDQ_ROOM: usize = 64;

/// A connected, authenticated socket.
pub(crate) struct Lane {
    pub sock: mio::net::TcpStream,
    /// Read ahead of `rx` (see [`Stage`]).
    pub stage: Stage,
    pub readable: bool,
    pub writable: bool,
    pub sendq: VecDeque<OutSeg>,
    pub rx: Rx,
    /// The peer sent a close frame: it shut down cleanly and sends nothing more.
    pub closed: bool,
}

impl Lane {
    pub fn new(sock: mio::net::TcpStream) -> Lane {
        Lane {
            sock,
            stage: Stage::new(),
            readable: true,
            writable: true,
            // Room for what a pipelined schedule keeps queued, so that a
            // steady-state step does not grow it (see tests/no_alloc.rs).
            sendq: VecDeque::with_capacity(SENDQ_ROOM),
            rx: Rx::new(),
            closed: false,
        }
    }

    /// The socket may hold new bytes (a readiness event, or a poke): read it
    /// again. Whatever an earlier read found about the socket being empty is
    /// stale now; kept, it would clear `readable` once the stage runs dry and
    /// lose the event, leaving the bytes unread until the peer sends more.
    pub fn mark_readable(&mut self) {
        self.readable = true;
        self.stage.drained = false;
    }
}

/// The greeting a dialing rank writes first on every lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub rank: u32,
    pub lane: u32,
    pub nlanes: u32,
    /// Derived from the job token, so that a stray connection from another job is refused.
    pub job_key: u64,
}

pub(crate) const HELLO_LEN: usize = 24;
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"GWH1");

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.rank.to_le_bytes());
        b[8..12].copy_from_slice(&self.lane.to_le_bytes());
        b[12..16].copy_from_slice(&self.nlanes.to_le_bytes());
        b[16..24].copy_from_slice(&self.job_key.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != HELLO_MAGIC {
            return None;
        }
        let mut k = [0u8; 8];
        k.copy_from_slice(&b[16..24]);
        Some(Hello {
            rank: u32_at(4),
            lane: u32_at(8),
            nlanes: u32_at(12),
            job_key: u64::from_le_bytes(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_roundtrip(rank in any::<u32>(), lane in any::<u32>(), nlanes in any::<u32>(), key in any::<u64>()) {
            let h = Hello { rank, lane, nlanes, job_key: key };
            prop_assert_eq!(Hello::decode(&h.encode()), Some(h));
        }

        #[test]
        fn hello_garbage_never_panics(b in prop::array::uniform24(any::<u8>())) {
            let _ = Hello::decode(&b);
        }
    }
}
