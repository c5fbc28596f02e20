//! Giving a thread's log lines a communicator's context without entering
//! its span, where entering would cost more than the call.
//!
//! A small collective (an 8-byte all-reduce over shared memory) takes about
//! half a microsecond; entering and leaving the communicator's span around
//! it, so that lines from inside carry the rank, made it 8–17% slower
//! (tracing-subscriber's registry: a thread-local span stack, reference
//! counts and per-layer filter look-ups on enter and again on exit). When
//! the subscriber is the one gradwire installs, nothing but our own layer
//! would see the span, so [`enter`] records the span's id in a thread-local
//! instead and [`LineLayer`](crate::LineLayer) reads the fields from there
//! when a line is printed (rare on such a path). Under any other subscriber
//! the span is entered as usual, so a host program's own layers get every
//! event with its spans' fields as before.

use std::cell::Cell;
use std::num::NonZeroU64;
use tracing::Span;
use tracing::span::Id;

thread_local! {
    /// The id of the span [`enter`] stands in for on this thread.
    static STAND_IN: Cell<Option<NonZeroU64>> = const { Cell::new(None) };
}

/// The span that lines from this thread belong to, beyond the spans the
/// event's own scope holds.
pub(crate) fn stand_in() -> Option<Id> {
    STAND_IN.with(|c| c.get()).map(Id::from_non_zero_u64)
}

/// `span` in effect for this thread's log lines until the guard drops; see
/// the module comment.
pub fn enter(span: &Span) -> InSpan<'_> {
    let Some(id) = span.id() else {
        // Disabled (logging off): there is no context to give.
        return InSpan::Nothing;
    };
    if tracing::dispatcher::get_default(|d| d.is::<crate::Installed>()) {
        let prev = STAND_IN.with(|c| c.replace(Some(id.into_non_zero_u64())));
        InSpan::StandIn { prev }
    } else {
        InSpan::Entered(span.enter())
    }
}

/// What [`enter`] did, undone on drop.
#[must_use = "the span is in effect only while the guard lives"]
pub enum InSpan<'a> {
    /// The span was disabled.
    Nothing,
    /// The thread-local stands in for the span (gradwire's subscriber).
    StandIn { prev: Option<NonZeroU64> },
    /// The span was entered (any other subscriber).
    Entered(tracing::span::Entered<'a>),
}

impl Drop for InSpan<'_> {
    fn drop(&mut self) {
        if let InSpan::StandIn { prev } = self {
            let prev = *prev;
            STAND_IN.with(|c| c.set(prev));
        }
    }
}
