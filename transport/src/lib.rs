//! gradwire's bottom layer: moving bytes between ranks.
//!
//! The layer knows nothing of collectives. It offers one transport seam
//! ([`seam::Transport`]) shaped like
//! NCCL's `ncclNet`, and the backends that implement it: TCP over mio ([`tcp`])
//! and same-host shared memory ([`shm`]). Every data frame carries the tag of
//! the message it belongs to ([`wire`]), with an opaque signature of its
//! operation, so that ranks that disagree about what they are doing fail
//! loudly instead of corrupting data.

pub mod error;
pub mod seam;
pub mod wire;

pub use error::{Error, Result};
pub use recv_core::{DEFAULT_EAGER_FRAMES, DEFAULT_SMALL_FRAMES, SMALL_FRAME_BYTES};
pub use seam::{
    Arrival, Landed, MemHandle, MemPtr, Now, Outstanding, Properties, Rank, Request, Scope,
    SendHint, Signature, Tag, TagFmt, Tested, Transport, TransportId,
};
pub use wire::{FrameHeader, FrameKind};

/// Copies `len` bytes from `src` to `dst`, around `rep movsb` where the
/// destination lies just past the source modulo a page, for which some CPUs
/// run it at a fifth of its speed or less (see `shm/near.rs`, where the
/// shared-memory backend's own copies and pulls handle such pairs): for the
/// local copies of every layer, which meet the same pairs.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes, and the two
/// ranges must not overlap.
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { shm::near::copy(dst, src, len) }
}

pub mod nic;
pub mod ofi;
mod recv_core;
mod regions;
mod reqmap;
pub mod rma;
pub mod shm;
pub mod tcp;
#[cfg(test)]
mod test_drive;
#[cfg(test)]
mod test_tags;
pub mod verbs;
