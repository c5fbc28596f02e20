//! gradwire's bottom layer: moving bytes between ranks.
//!
//! The layer knows nothing of collectives. It offers one transport seam
//! ([`seam::Transport`]) shaped like
//! NCCL's `ncclNet`, and the backends that implement it: TCP over mio ([`tcp`])
//! and same-host shared memory ([`shm`]). Every data frame carries the
//! fingerprint of the operation that sent it ([`wire`]) so that ranks that
//! disagree about what they are doing fail loudly instead of corrupting data.

pub mod error;
pub mod seam;
pub mod wire;

pub use error::{Error, Result};
pub use seam::{Landed, MemHandle, Now, Properties, Rank, Request, Tag, Transport};
#[doc(hidden)]
pub use unexpected::early_buffers_allocated;
pub use wire::{DType, Fingerprint, FrameHeader, FrameKind, OpKind, RedOp};

mod reqmap;
pub mod shm;
pub mod tcp;
mod unexpected;
