//! The data-plane frame header and the message tag it carries.
//!
//! Every segment that crosses a transport starts with a fixed 64-byte header.
//! Besides placement (`offset`, `len`, `total`) it carries the [`Tag`] of the
//! message: which conversation (communicator), which operation slot in it,
//! which message of that operation, and a signature of the operation that
//! the layer above chose and the transport only compares. A receiver that
//! finds a frame of its operation slot with another signature reports both
//! sides' calls: the most common way collective libraries hang or silently
//! corrupt data is ranks that disagree.
//!
//! The codec is pure (no I/O) and total: any 64 bytes decode to a header or to
//! an error, never a panic.

use crate::error::{Error, Result};
use std::fmt;

/// Size of an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 64;
/// "GWF3": the layout with credits and announced messages (GWF2 had no
/// flow control; GWF1 spelled out the collective's fields).
const MAGIC: u32 = u32::from_le_bytes(*b"GWF3");
/// Flag bit: the signature is compared per message, not per operation slot.
const FLAG_PER_MESSAGE: u8 = 1;
/// Flag bit: a data frame of an announced message, sent after the receiver
/// said its receive is posted (see [`FrameKind::Cts`]); it used no credit.
const FLAG_CLEARED: u8 = 2;

/// Flag bit never sent: in its own slots, the shared-memory ring folds a
/// one-segment data message of at most [`INLINE_MAX`] bytes into the
/// header's offset and total words ([`fold_inline`]), so that the frame
/// moves between cores as one cache line instead of two, and restores the
/// header before anyone decodes it ([`unfold_inline`]). [`FrameHeader::decode`]
/// rejects it like any unknown flag.
const FLAG_INLINE: u8 = 0x80;
/// Most payload bytes a folded header carries (its offset and total words).
pub(crate) const INLINE_MAX: usize = 16;
/// Where a folded header's payload starts: the offset word.
pub(crate) const INLINE_AT: usize = 48;
/// Where an encoded header keeps its flags.
pub(crate) const FLAGS_AT: usize = 5;

/// What the layer above a transport says about one operation: opaque bytes
/// that two ranks in the same operation slot must agree on. gradwire's
/// collectives put the operation kind, element type, reduction, root and
/// element count here; the transport only compares them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Signature(pub [u8; Signature::LEN]);

impl Signature {
    /// Bytes in a signature (what the 64-byte frame header has room for).
    pub const LEN: usize = 12;
}

/// How far a signature has to agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every message of the operation slot carries the same signature: a
    /// frame of the slot with another one is a disagreement at any step
    /// (collectives).
    Operation,
    /// Messages of one slot are independent and told apart by their step
    /// alone; signatures are compared only between frames of the same step
    /// (point-to-point messages, which all share one slot).
    Message,
}

/// Prints a tag's operation (not its step) for error messages. The layer
/// that makes tags supplies it, since only that layer knows what the
/// signature means.
pub type TagFmt = fn(&Tag, &mut fmt::Formatter<'_>) -> fmt::Result;

/// Names one message: which conversation, which operation slot in it, which
/// message of the operation, and what the operation is.
#[derive(Clone, Copy)]
pub struct Tag {
    /// The conversation (a communicator's id).
    pub comm: u64,
    /// The operation slot within the conversation; messages match only
    /// within one slot.
    pub seq: u64,
    /// The message within the operation (an algorithm step, a point-to-point
    /// ordinal).
    pub step: u32,
    pub sig: Signature,
    pub scope: Scope,
    /// How to print the operation.
    pub show: TagFmt,
}

impl PartialEq for Tag {
    /// Tags are the same message when every field but the printer agrees.
    fn eq(&self, o: &Tag) -> bool {
        (self.comm, self.seq, self.step, self.sig, self.scope)
            == (o.comm, o.seq, o.step, o.sig, o.scope)
    }
}

impl Eq for Tag {}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({self} step {})", self.step)
    }
}

/// Prints the operation of a tag whose signature this layer cannot read.
fn show_raw(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "operation(comm={:#x}, seq={}, signature=", t.comm, t.seq)?;
    for b in t.sig.0 {
        write!(f, "{b:02x}")?;
    }
    f.write_str(")")
}

impl fmt::Display for Tag {
    /// The operation, as the tag's maker prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.show)(self, f)
    }
}

impl Tag {
    /// The tag of control frames (abort, close), which belong to no message.
    pub const NONE: Tag = Tag::raw(0, 0, 0, Signature([0; Signature::LEN]), Scope::Message);

    /// A tag printed in hex: what a transport decodes from the wire before
    /// it knows which of its receives the frame is for.
    pub const fn raw(comm: u64, seq: u64, step: u32, sig: Signature, scope: Scope) -> Tag {
        Tag {
            comm,
            seq,
            step,
            sig,
            scope,
            show: show_raw,
        }
    }

    /// `self`, printed the way `like` is (a frame compared with a posted
    /// receive is shown in the receive's vocabulary).
    pub fn described_like(mut self, like: &Tag) -> Tag {
        self.show = like.show;
        self
    }

    /// Whether a frame belongs to the message this tag names.
    ///
    /// Returns an error when the frame comes from the same operation slot
    /// (communicator and sequence number) but describes a different call:
    /// the two ranks disagree about what they are doing.
    pub fn matches(&self, me: u32, h: &FrameHeader, expected_total: u64) -> Result<bool> {
        if h.tag.comm != self.comm || h.tag.seq != self.seq {
            return Ok(false);
        }
        // Point-to-point messages all share one sequence number and are told
        // apart by their per-pair step alone: a frame of a later send (on
        // another lane, say) is not a disagreement about this one.
        if self.scope == Scope::Message && h.tag.scope == Scope::Message && h.tag.step != self.step
        {
            return Ok(false);
        }
        let theirs = h.tag.described_like(self);
        if h.tag.sig != self.sig || h.tag.scope != self.scope {
            return Err(Error::Mismatch {
                me,
                peer: h.src_rank,
                local: self.to_string(),
                remote: theirs.to_string(),
            });
        }
        if h.tag.step != self.step {
            return Ok(false);
        }
        if h.total != expected_total {
            return Err(Error::Mismatch {
                me,
                peer: h.src_rank,
                local: format!(
                    "{self} expecting {expected_total} bytes at step {}",
                    self.step
                ),
                remote: format!("{theirs} sending {} bytes at step {}", h.total, h.tag.step),
            });
        }
        Ok(true)
    }
}

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A segment of a message.
    Data = 1,
    /// The sender failed; the payload is a UTF-8 message saying why.
    Abort = 2,
    /// The sender shut its communicator down cleanly; nothing follows.
    Close = 3,
    /// Shared memory only: the whole message waits in the sender's memory
    /// for the receiver to copy it out; the payload is its address and a
    /// completion number (see `shm/pull.rs`).
    Rendezvous = 4,
    /// The sender has a message (`tag`, `total` bytes) but no credit to
    /// send it eagerly: it sends it once told the receive is posted. No
    /// payload; `offset` carries the announcement's id.
    Rts = 5,
    /// The receive for announcement `offset` is posted: send its data
    /// (as cleared frames). No payload.
    Cts = 6,
    /// Returns `credits` without carrying anything else (every frame can
    /// return credits; this one exists for when no other frame goes back).
    Credit = 7,
    /// Shared memory only: the sender stored bytes straight into a region
    /// this rank published (a one-sided write, see `Transport::write_imm`);
    /// `offset` carries the write's 32-bit immediate. No payload.
    Imm = 8,
    /// RDMA only: the receive for announcement `offset` is posted, and the
    /// payload (a `crate::rma::Grant`) says where to write it.
    Grant = 9,
    /// TCP only: a one-sided write carried over the stream. The payload
    /// lands at byte `offset` of the receiver's published region named by
    /// the high 32 bits of `total` (its key), and the low 32 bits are the
    /// write's immediate, delivered once the bytes are in.
    Put = 10,
    /// TCP only: a one-sided read asked over the stream. No payload; the
    /// receiver sends back the `tag.seq` bytes at byte `offset` of its
    /// published region named by the high 32 bits of `total` (its key), in
    /// a [`FrameKind::Fetched`] frame for read `tag.comm` of the sender.
    Get = 11,
    /// TCP only: the bytes a [`FrameKind::Get`] asked for; `offset` is the
    /// reader's read id.
    Fetched = 12,
}

/// The fixed header in front of every segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    /// A data frame sent after a [`FrameKind::Cts`]: it used no credit and
    /// must find its receive posted.
    pub cleared: bool,
    /// Eager frames of the opposite direction that the sender of this frame
    /// has consumed since it last said so: credits handed back to the
    /// receiver of this frame (see `recv_core`).
    pub credits: u16,
    pub src_rank: u32,
    /// The message this segment belongs to.
    pub tag: Tag,
    /// Byte offset of this segment within its message.
    pub offset: u64,
    /// Payload bytes following the header.
    pub len: u64,
    /// Total bytes of the message this segment belongs to.
    pub total: u64,
}

impl FrameHeader {
    /// A frame that belongs to no message (abort reasons, close notices)
    /// with `len` payload bytes.
    pub fn control(kind: FrameKind, src_rank: u32, len: usize) -> FrameHeader {
        FrameHeader {
            kind,
            cleared: false,
            credits: 0,
            src_rank,
            tag: Tag::NONE,
            offset: 0,
            len: len as u64,
            total: len as u64,
        }
    }

    /// Encodes into the 64-byte wire form (little endian):
    /// magic 0..4, kind 4, flags 5, credits 6..8, signature 8..20, source
    /// rank 20..24, communicator 24..32, sequence 32..40, step 40..44,
    /// segment length 44..48, offset 48..56, total 56..64.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = match self.tag.scope {
            Scope::Operation => 0,
            Scope::Message => FLAG_PER_MESSAGE,
        } | if self.cleared { FLAG_CLEARED } else { 0 };
        b[6..8].copy_from_slice(&self.credits.to_le_bytes());
        b[8..20].copy_from_slice(&self.tag.sig.0);
        b[20..24].copy_from_slice(&self.src_rank.to_le_bytes());
        b[24..32].copy_from_slice(&self.tag.comm.to_le_bytes());
        b[32..40].copy_from_slice(&self.tag.seq.to_le_bytes());
        b[40..44].copy_from_slice(&self.tag.step.to_le_bytes());
        // A segment's payload fits in 32 bits (segments are small); the
        // message's total does not.
        let len32 = u32::try_from(self.len).unwrap_or(u32::MAX);
        b[44..48].copy_from_slice(&len32.to_le_bytes());
        b[48..56].copy_from_slice(&self.offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// Decodes a header; any malformed input is a [`Error::Protocol`]. The
    /// tag describes its operation in hex until a receiver that knows the
    /// vocabulary adopts it (see [`Tag::described_like`]).
    pub fn decode(b: &[u8]) -> Result<FrameHeader> {
        if b.len() < HEADER_LEN {
            return Err(Error::Protocol(format!(
                "frame header too short: {} bytes, need {HEADER_LEN}",
                b.len()
            )));
        }
        let u32_at = |i: usize| le_u32(b, i);
        let u64_at = |i: usize| le_u64(b, i);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(Error::Protocol(format!(
                "bad frame magic {magic:#010x} (expected {MAGIC:#010x}): the peer is not speaking gradwire's data protocol or the stream lost sync"
            )));
        }
        let kind = match b[4] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Close,
            4 => FrameKind::Rendezvous,
            5 => FrameKind::Rts,
            6 => FrameKind::Cts,
            7 => FrameKind::Credit,
            8 => FrameKind::Imm,
            9 => FrameKind::Grant,
            10 => FrameKind::Put,
            11 => FrameKind::Get,
            12 => FrameKind::Fetched,
            k => return Err(Error::Protocol(format!("unknown frame kind {k}"))),
        };
        let flags = b[5];
        if flags & !(FLAG_PER_MESSAGE | FLAG_CLEARED) != 0 {
            return Err(Error::Protocol(format!("unknown frame flags {flags:#04x}")));
        }
        let scope = if flags & FLAG_PER_MESSAGE != 0 {
            Scope::Message
        } else {
            Scope::Operation
        };
        let cleared = flags & FLAG_CLEARED != 0;
        if cleared && kind != FrameKind::Data {
            return Err(Error::Protocol(format!(
                "a {kind:?} frame marked as cleared data"
            )));
        }
        let mut sig = [0u8; Signature::LEN];
        sig.copy_from_slice(&b[8..20]);
        let len = u32_at(44) as u64;
        let offset = u64_at(48);
        let total = u64_at(56);
        match kind {
            // Control frames carry no payload; their `offset` is an id.
            FrameKind::Rts
            | FrameKind::Cts
            | FrameKind::Credit
            | FrameKind::Imm
            | FrameKind::Get
                if len != 0 =>
            {
                return Err(Error::Protocol(format!(
                    "a {kind:?} frame with a {len}-byte payload"
                )));
            }
            FrameKind::Grant if len != crate::rma::GRANT_LEN as u64 => {
                return Err(Error::Protocol(format!(
                    "a grant frame with a {len}-byte payload (a grant is {} bytes)",
                    crate::rma::GRANT_LEN
                )));
            }
            FrameKind::Data | FrameKind::Rendezvous
                if offset.checked_add(len).is_none_or(|end| end > total) =>
            {
                return Err(Error::Protocol(format!(
                    "segment [{offset}, +{len}) lies outside its {total}-byte message"
                )));
            }
            _ => {}
        }
        Ok(FrameHeader {
            kind,
            cleared,
            credits: u16::from_le_bytes([b[6], b[7]]),
            src_rank: u32_at(20),
            tag: Tag::raw(u64_at(24), u64_at(32), u32_at(40), Signature(sig), scope),
            offset,
            len,
            total,
        })
    }
}

/// Folds `payload` into the encoded header `h` if it is the whole of a data
/// message of 1 to [`INLINE_MAX`] bytes (offset 0, total = length): the
/// payload takes the offset and total words, zero-padded, and the header
/// is marked. Returns whether it did; a header it declines is untouched.
pub(crate) fn fold_inline(h: &mut [u8; HEADER_LEN], payload: &[u8]) -> bool {
    let n = payload.len();
    let whole = le_u32(h, 44) as usize == n
        && le_u64(h, INLINE_AT) == 0
        && le_u64(h, INLINE_AT + 8) == n as u64;
    if !(1..=INLINE_MAX).contains(&n) || h[4] != FrameKind::Data as u8 || !whole {
        return false;
    }
    h[FLAGS_AT] |= FLAG_INLINE;
    h[INLINE_AT..].fill(0);
    h[INLINE_AT..INLINE_AT + n].copy_from_slice(payload);
    true
}

/// Whether an encoded header whose flags byte is `flags` is folded (see
/// [`fold_inline`]).
pub(crate) fn is_folded(flags: u8) -> bool {
    flags & FLAG_INLINE != 0
}

/// Undoes [`fold_inline`] on a copy of a header: offset 0 and total = length
/// again, the mark cleared, so that [`FrameHeader::decode`] reads what was
/// encoded. A header that is not folded is left as it is. A mark on
/// anything [`fold_inline`] would not have folded is an error naming it.
pub(crate) fn unfold_inline(h: &mut [u8; HEADER_LEN]) -> std::result::Result<(), String> {
    // Without the magic it is no header at all, and decoding says so.
    if !is_folded(h[FLAGS_AT]) || le_u32(h, 0) != MAGIC {
        return Ok(());
    }
    let n = le_u32(h, 44) as usize;
    if h[4] != FrameKind::Data as u8 || !(1..=INLINE_MAX).contains(&n) {
        return Err(format!(
            "a header of kind {} with a {n}-byte payload marked as folded (only data of 1 to {INLINE_MAX} bytes is)",
            h[4]
        ));
    }
    h[FLAGS_AT] &= !FLAG_INLINE;
    h[INLINE_AT..INLINE_AT + 8].copy_from_slice(&0u64.to_le_bytes());
    h[INLINE_AT + 8..].copy_from_slice(&(n as u64).to_le_bytes());
    Ok(())
}

/// The little-endian `u32` at `b[i..i + 4]`; the caller checked the length.
pub(crate) fn le_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The little-endian `u64` at `b[i..i + 8]`; the caller checked the length.
pub(crate) fn le_u64(b: &[u8], i: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_header() -> impl Strategy<Value = FrameHeader> {
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<[u8; Signature::LEN]>(),
            any::<bool>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            0usize..8,
            any::<u16>(),
        )
            .prop_map(
                |(src, comm, seq, sig, per_msg, step, total, len, kind, credits)| {
                    let len = (len as u64).min(total);
                    let offset = (total - len) / 2;
                    let control = kind >= 4;
                    let len = if control { 0 } else { len };
                    let scope = if per_msg {
                        Scope::Message
                    } else {
                        Scope::Operation
                    };
                    let kind = [
                        FrameKind::Data,
                        FrameKind::Abort,
                        FrameKind::Close,
                        FrameKind::Rendezvous,
                        FrameKind::Rts,
                        FrameKind::Cts,
                        FrameKind::Credit,
                        FrameKind::Imm,
                    ][kind];
                    FrameHeader {
                        kind,
                        cleared: kind == FrameKind::Data && per_msg && total % 2 == 0,
                        credits,
                        src_rank: src,
                        tag: Tag::raw(comm, seq, step, Signature(sig), scope),
                        offset,
                        len,
                        total,
                    }
                },
            )
    }

    /// Headers of any kind saying 0 to 20 bytes, the whole of a message or
    /// a segment of it (control kinds with a payload do not decode, but
    /// folding must decline them by their kind alone).
    fn arb_small_header() -> impl Strategy<Value = FrameHeader> {
        (arb_header(), 0u64..=20, 0u64..2, 0u64..2).prop_map(|(mut h, len, off, more)| {
            (h.len, h.offset, h.total) = (len, off, len + off + more);
            h
        })
    }

    proptest! {
        #[test]
        fn roundtrip(h in arb_header()) {
            let enc = h.encode();
            prop_assert_eq!(FrameHeader::decode(&enc).unwrap(), h);
        }

        /// Folding takes exactly the whole data messages of 1 to 16 bytes,
        /// and unfolding gives back the encoded header; a folded header
        /// does not decode as it is (its mark is unknown to the wire).
        #[test]
        fn folding_is_undone_exactly(h in arb_small_header(), fill in any::<u8>()) {
            let enc = h.encode();
            let payload = vec![fill; h.len as usize];
            let mut b = enc;
            let folded = fold_inline(&mut b, &payload);
            let want = h.kind == FrameKind::Data
                && (1..=16).contains(&h.len)
                && h.offset == 0
                && h.total == h.len;
            prop_assert_eq!(folded, want);
            if folded {
                prop_assert!(FrameHeader::decode(&b).is_err());
                prop_assert_eq!(&b[INLINE_AT..INLINE_AT + payload.len()], &payload[..]);
            } else {
                prop_assert_eq!(b, enc);
            }
            unfold_inline(&mut b).unwrap();
            prop_assert_eq!(b, enc);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = FrameHeader::decode(&bytes);
        }

        /// Whatever 64 bytes decode encode back to exactly those bytes, for
        /// every kind (`arb_header` leaves out grants, puts, gets and
        /// fetches): decoding
        /// drops nothing a peer sent, and the roundtrip holds beyond the
        /// headers this crate builds. The magic, kind, flags and length are
        /// steered toward values that decode; the rest is arbitrary.
        #[test]
        fn decoded_bytes_encode_back_to_themselves(
            rest in prop::collection::vec(any::<u8>(), HEADER_LEN),
            kind in 0u8..14,
            flags in 0u8..4,
            len in prop_oneof![Just(0u32), Just(crate::rma::GRANT_LEN as u32), any::<u32>()],
            offset in prop_oneof![0u64..64, any::<u64>()],
        ) {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&rest);
            b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            b[4] = kind;
            b[5] = flags;
            b[44..48].copy_from_slice(&len.to_le_bytes());
            b[48..56].copy_from_slice(&offset.to_le_bytes());
            if let Ok(h) = FrameHeader::decode(&b) {
                prop_assert_eq!(h.encode(), b);
                prop_assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
            }
        }

        #[test]
        fn corrupted_headers_never_panic(h in arb_header(), i in 0usize..HEADER_LEN, v in any::<u8>()) {
            let mut enc = h.encode();
            enc[i] = v;
            if let Ok(d) = FrameHeader::decode(&enc)
                && matches!(d.kind, FrameKind::Data | FrameKind::Rendezvous)
            {
                prop_assert!(d.offset + d.len <= d.total);
            }
        }
    }

    #[test]
    fn bad_magic_is_named() {
        let e = FrameHeader::decode(&[0u8; HEADER_LEN]).unwrap_err();
        assert!(e.to_string().contains("bad frame magic"), "{e}");
    }

    #[test]
    fn unknown_flags_are_refused() {
        let mut enc = FrameHeader::control(FrameKind::Close, 1, 0).encode();
        enc[5] = 0x80;
        let e = FrameHeader::decode(&enc).unwrap_err();
        assert!(e.to_string().contains("unknown frame flags"), "{e}");
        // Only data can be cleared.
        enc[5] = FLAG_CLEARED;
        let e = FrameHeader::decode(&enc).unwrap_err();
        assert!(e.to_string().contains("cleared"), "{e}");
    }

    // ---- tags ----

    /// Prints the signature's first byte as a type code, as a test vocabulary.
    fn show(t: &Tag, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op(seq={}, type={})", t.seq, t.sig.0[0])
    }

    fn tag(scope: Scope, ty: u8, step: u32) -> Tag {
        let mut sig = Signature::default();
        sig.0[0] = ty;
        Tag {
            comm: 9,
            seq: if scope == Scope::Message { u64::MAX } else { 4 },
            step,
            sig,
            scope,
            show,
        }
    }

    fn frame(tag: Tag) -> FrameHeader {
        // What the wire gives back: printed raw until matched.
        let raw = Tag::raw(tag.comm, tag.seq, tag.step, tag.sig, tag.scope);
        FrameHeader {
            kind: FrameKind::Data,
            cleared: false,
            credits: 0,
            src_rank: 1,
            tag: raw,
            offset: 0,
            len: 8,
            total: 8,
        }
    }

    #[test]
    fn a_later_point_to_point_message_of_another_type_is_not_a_mismatch() {
        let want = tag(Scope::Message, 6, 5);
        let later = frame(tag(Scope::Message, 0, 6));
        assert!(!want.matches(0, &later, 8).unwrap());
        // The same step with another type is a real disagreement.
        let same = frame(tag(Scope::Message, 0, 5));
        assert!(matches!(
            want.matches(0, &same, 8),
            Err(Error::Mismatch { .. })
        ));
        assert!(want.matches(0, &frame(want), 8).unwrap());
    }

    #[test]
    fn a_collective_of_another_kind_in_the_same_slot_is_a_mismatch_at_any_step() {
        let want = tag(Scope::Operation, 5, 0);
        let other = frame(tag(Scope::Operation, 4, 3));
        match want.matches(0, &other, 8) {
            // Both sides are printed in the receiver's vocabulary.
            Err(Error::Mismatch { local, remote, .. }) => {
                assert_eq!(local, "op(seq=4, type=5)");
                assert_eq!(remote, "op(seq=4, type=4)");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn a_tag_without_a_vocabulary_prints_its_signature_in_hex() {
        let t = Tag::raw(
            0x10,
            2,
            0,
            Signature([0xab; Signature::LEN]),
            Scope::Operation,
        );
        assert_eq!(
            t.to_string(),
            format!("operation(comm=0x10, seq=2, signature={})", "ab".repeat(12))
        );
    }
}
