//! The store's wire format, with no I/O.
//!
//! Kept apart from the sockets so that it can be tested exhaustively with
//! arbitrary and corrupted bytes (the server faces whatever reaches its port)
//! and so that the server and the client cannot disagree about a byte.
//!
//! A frame is `[len: u32 LE][tag: u8][payload]`, where `len` counts the tag and
//! the payload. Byte strings and lists are prefixed with a `u32 LE` length or
//! count, integers are little-endian. Decoding is strict (no trailing bytes,
//! booleans are 0 or 1, keys are UTF-8) so that every frame has exactly one
//! encoding.
//!
//! Size caps are checked on the frame header, as soon as its five bytes have
//! arrived, so a peer that announces an oversized value is refused before any
//! memory is set aside for it. Before a connection has authenticated, the
//! server's decoder admits only frames as small as a Hello
//! ([`Decoder::hello_only`]), so a stranger cannot make it buffer a value.
//! Nothing is allocated for a count or a length beyond what the bytes already
//! received could hold: lists reserve at most [`RESERVE_MAX`] entries up front
//! and grow as their items decode.

use crate::error::{Error, Result};
use std::marker::PhantomData;

/// Version carried by the hello frame; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
/// Bytes in a frame header (length and tag).
pub const HEADER_LEN: usize = 5;
/// Longest accepted job token.
pub const MAX_TOKEN_BYTES: usize = 4096;
/// Longest error or refusal message a server may send.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Largest body (tag included) of a Hello frame: version, token length and
/// the longest token. The most a server buffers from an unauthenticated peer.
pub const MAX_HELLO_BODY: usize = 1 + 4 + 4 + MAX_TOKEN_BYTES;
/// Most entries a decoded list reserves before its items arrive: a forged
/// count then costs at most this many slots, not 24 bytes per 4 received.
pub const RESERVE_MAX: usize = 1024;

/// Size caps a decoder enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key.
    pub max_key_bytes: usize,
    /// Longest value.
    pub max_value_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 4096,
            max_value_bytes: 16 << 20,
        }
    }
}

impl Limits {
    /// Longest encoded key list (`wait`, `check`): as large as one value, so
    /// that a job can wait on every rank's key at once without a separate knob.
    fn list_cap(&self) -> usize {
        self.max_value_bytes.saturating_add(4)
    }
}

/// A client's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Must be the first frame on a connection.
    Hello {
        version: u32,
        token: String,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
    },
    /// Blocks on the server for at most `timeout_ms`: the server owns the wait
    /// so that one round trip answers it, however many keys there are.
    Wait {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    Check {
        keys: Vec<String>,
    },
    Add {
        key: String,
        delta: i64,
    },
    Delete {
        key: String,
    },
}

/// The server's reply to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// Accepts a hello and tells the client the caps, so that it can reject an
    /// oversized request itself with a clear error instead of being dropped.
    Welcome {
        max_key_bytes: u64,
        max_value_bytes: u64,
    },
    /// Rejects a hello; the server closes the connection after sending it.
    Refused(String),
    /// The server is at its connection cap; the client may retry later. Sent
    /// before anything is read, so it answers whatever the client sent first.
    Busy(String),
    Ok,
    Value(Option<Vec<u8>>),
    Values(Vec<Vec<u8>>),
    /// A `wait` ran out of time; lists the keys that were still missing.
    TimedOut {
        missing: Vec<String>,
    },
    Exists(Vec<bool>),
    Counter(i64),
    Deleted(bool),
    Error(String),
}

mod tag {
    pub const HELLO: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const GET: u8 = 0x03;
    pub const WAIT: u8 = 0x04;
    pub const CHECK: u8 = 0x05;
    pub const ADD: u8 = 0x06;
    pub const DELETE: u8 = 0x07;

    pub const WELCOME: u8 = 0x80;
    pub const REFUSED: u8 = 0x81;
    pub const OK: u8 = 0x82;
    pub const VALUE: u8 = 0x83;
    pub const VALUES: u8 = 0x84;
    pub const TIMED_OUT: u8 = 0x85;
    pub const EXISTS: u8 = 0x86;
    pub const COUNTER: u8 = 0x87;
    pub const DELETED: u8 = 0x88;
    pub const ERROR: u8 = 0x89;
    pub const BUSY: u8 = 0x8a;
}

/// A message type that travels in frames.
pub trait Message: Sized {
    /// "request" or "response", for error messages.
    const KIND: &'static str;
    /// The largest body (tag included) a frame with this tag may declare.
    fn frame_cap(tag: u8, limits: &Limits) -> Result<usize>;
    /// Checks the length fields of a frame's body as they arrive, so that an
    /// oversized value inside a frame whose total is within the cap is refused
    /// before the value is buffered. `prefix` is the part of the body (after
    /// the tag) received so far. Must be monotone: an error on a prefix is the
    /// same error on any longer prefix, and the first error `decode_body`
    /// would report on fields it checks.
    fn check_prefix(tag: u8, prefix: &[u8], limits: &Limits) -> Result<()> {
        let _ = (tag, prefix, limits);
        Ok(())
    }
    /// Decodes one body (without the tag), already known to be within the cap.
    fn decode_body(tag: u8, body: &[u8], limits: &Limits) -> Result<Self>;
    /// The whole frame, header included. Fails only if a field or the frame
    /// does not fit its `u32` length.
    fn encode(&self) -> Result<Vec<u8>>;
    /// Short name for logs ("Set", "Wait", ...).
    fn name(&self) -> &'static str;
}

fn proto(msg: impl Into<String>) -> Error {
    Error::Protocol(msg.into())
}

/// Starts a frame; [`finish`] patches in the length.
fn begin(tag: u8, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN.saturating_add(capacity));
    out.extend_from_slice(&[0, 0, 0, 0, tag]);
    out
}

fn finish(mut out: Vec<u8>) -> Result<Vec<u8>> {
    let body = out.len() - 4;
    let len = u32::try_from(body).map_err(|_| {
        Error::InvalidArgument(format!("store frame of {body} bytes exceeds 4 GiB"))
    })?;
    out[..4].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

fn put_len(out: &mut Vec<u8>, n: usize) -> Result<()> {
    let n = u32::try_from(n)
        .map_err(|_| Error::InvalidArgument(format!("store field of {n} bytes exceeds 4 GiB")))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) -> Result<()> {
    put_len(out, b.len())?;
    out.extend_from_slice(b);
    Ok(())
}

fn put_list<T: AsRef<[u8]>>(out: &mut Vec<u8>, items: &[T]) -> Result<()> {
    put_len(out, items.len())?;
    for it in items {
        put_bytes(out, it.as_ref())?;
    }
    Ok(())
}

fn list_size<T: AsRef<[u8]>>(items: &[T]) -> usize {
    items.iter().fold(4usize, |n, it| {
        n.saturating_add(4).saturating_add(it.as_ref().len())
    })
}

fn too_long(what: &str, field: &str, n: usize, max: usize) -> Error {
    proto(format!(
        "{what} frame: {field} of {n} bytes exceeds the limit of {max}"
    ))
}

fn len_at(p: &[u8], at: usize) -> Option<usize> {
    let b = p.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Bounds-checked reader over one frame body.
struct Body<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            return Err(proto(format!(
                "{} frame truncated: field of {n} bytes, {} left",
                self.what,
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(proto(format!("{} frame: bad boolean byte {b}", self.what))),
        }
    }

    fn u32(&mut self) -> Result<usize> {
        Ok(u32::from_le_bytes(self.array()?) as usize)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed byte string of at most `max` bytes (`field` names the
    /// cap in the error).
    fn bytes(&mut self, max: usize, field: &str) -> Result<&'a [u8]> {
        let n = self.u32()?;
        if n > max {
            return Err(too_long(self.what, field, n, max));
        }
        self.take(n)
    }

    fn string(&mut self, max: usize, field: &str) -> Result<String> {
        let b = self.bytes(max, field)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(proto(format!("{} frame: {field} is not UTF-8", self.what))),
        }
    }

    /// Reads a count and checks it against the bytes left, so a forged count
    /// cannot make the decoder reserve more than the frame could hold.
    fn count(&mut self, min_item: usize) -> Result<usize> {
        let n = self.u32()?;
        if n.saturating_mul(min_item.max(1)) > self.rest.len() {
            return Err(proto(format!(
                "{} frame: count {n} does not fit in {} remaining bytes",
                self.what,
                self.rest.len()
            )));
        }
        Ok(n)
    }

    fn keys(&mut self, limits: &Limits) -> Result<Vec<String>> {
        let n = self.count(4)?;
        let mut keys = reserve(n);
        for _ in 0..n {
            keys.push(self.string(limits.max_key_bytes, "key")?);
        }
        Ok(keys)
    }

    fn end(self) -> Result<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(proto(format!(
                "{} frame has {} trailing bytes",
                self.what,
                self.rest.len()
            )))
        }
    }
}

impl Message for Request {
    const KIND: &'static str = "request";

    fn frame_cap(t: u8, l: &Limits) -> Result<usize> {
        let key = 4usize.saturating_add(l.max_key_bytes);
        let cap = match t {
            tag::HELLO => MAX_HELLO_BODY - 1,
            tag::SET => key.saturating_add(4).saturating_add(l.max_value_bytes),
            tag::GET | tag::DELETE => key,
            tag::ADD => key.saturating_add(8),
            tag::WAIT => l.list_cap().saturating_add(8),
            tag::CHECK => l.list_cap(),
            _ => return Err(proto(format!("unknown request tag 0x{t:02x}"))),
        };
        Ok(cap.saturating_add(1))
    }

    fn check_prefix(t: u8, p: &[u8], l: &Limits) -> Result<()> {
        if t != tag::SET {
            return Ok(());
        }
        let Some(k) = len_at(p, 0) else {
            return Ok(());
        };
        if k > l.max_key_bytes {
            return Err(too_long("Set", "key", k, l.max_key_bytes));
        }
        match len_at(p, 4 + k) {
            Some(v) if v > l.max_value_bytes => Err(too_long("Set", "value", v, l.max_value_bytes)),
            _ => Ok(()),
        }
    }

    fn decode_body(t: u8, body: &[u8], l: &Limits) -> Result<Self> {
        let mut b = Body {
            rest: body,
            what: request_name(t),
        };
        let msg = match t {
            tag::HELLO => Request::Hello {
                version: b.u32()? as u32,
                token: b.string(MAX_TOKEN_BYTES, "token")?,
            },
            tag::SET => Request::Set {
                key: b.string(l.max_key_bytes, "key")?,
                value: b.bytes(l.max_value_bytes, "value")?.to_vec(),
            },
            tag::GET => Request::Get {
                key: b.string(l.max_key_bytes, "key")?,
            },
            tag::WAIT => Request::Wait {
                timeout_ms: b.u64()?,
                keys: b.keys(l)?,
            },
            tag::CHECK => Request::Check { keys: b.keys(l)? },
            tag::ADD => Request::Add {
                key: b.string(l.max_key_bytes, "key")?,
                delta: b.i64()?,
            },
            tag::DELETE => Request::Delete {
                key: b.string(l.max_key_bytes, "key")?,
            },
            _ => return Err(proto(format!("unknown request tag 0x{t:02x}"))),
        };
        b.end()?;
        Ok(msg)
    }

    fn encode(&self) -> Result<Vec<u8>> {
        let out = match self {
            Request::Hello { version, token } => {
                let mut o = begin(tag::HELLO, 8 + token.len());
                o.extend_from_slice(&version.to_le_bytes());
                put_bytes(&mut o, token.as_bytes())?;
                o
            }
            Request::Set { key, value } => {
                let mut o = begin(tag::SET, 8 + key.len() + value.len());
                put_bytes(&mut o, key.as_bytes())?;
                put_bytes(&mut o, value)?;
                o
            }
            Request::Get { key } => {
                let mut o = begin(tag::GET, 4 + key.len());
                put_bytes(&mut o, key.as_bytes())?;
                o
            }
            Request::Wait { keys, timeout_ms } => {
                let mut o = begin(tag::WAIT, 8usize.saturating_add(list_size(keys)));
                o.extend_from_slice(&timeout_ms.to_le_bytes());
                put_list(&mut o, keys)?;
                o
            }
            Request::Check { keys } => {
                let mut o = begin(tag::CHECK, list_size(keys));
                put_list(&mut o, keys)?;
                o
            }
            Request::Add { key, delta } => {
                let mut o = begin(tag::ADD, 12 + key.len());
                put_bytes(&mut o, key.as_bytes())?;
                o.extend_from_slice(&delta.to_le_bytes());
                o
            }
            Request::Delete { key } => {
                let mut o = begin(tag::DELETE, 4 + key.len());
                put_bytes(&mut o, key.as_bytes())?;
                o
            }
        };
        finish(out)
    }

    fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::Set { .. } => "Set",
            Request::Get { .. } => "Get",
            Request::Wait { .. } => "Wait",
            Request::Check { .. } => "Check",
            Request::Add { .. } => "Add",
            Request::Delete { .. } => "Delete",
        }
    }
}

fn request_name(t: u8) -> &'static str {
    match t {
        tag::HELLO => "Hello",
        tag::SET => "Set",
        tag::GET => "Get",
        tag::WAIT => "Wait",
        tag::CHECK => "Check",
        tag::ADD => "Add",
        tag::DELETE => "Delete",
        _ => "unknown request",
    }
}

fn response_name(t: u8) -> &'static str {
    match t {
        tag::WELCOME => "Welcome",
        tag::REFUSED => "Refused",
        tag::OK => "Ok",
        tag::VALUE => "Value",
        tag::VALUES => "Values",
        tag::TIMED_OUT => "TimedOut",
        tag::EXISTS => "Exists",
        tag::COUNTER => "Counter",
        tag::DELETED => "Deleted",
        tag::ERROR => "Error",
        tag::BUSY => "Busy",
        _ => "unknown response",
    }
}

impl Message for Response {
    const KIND: &'static str = "response";

    fn frame_cap(t: u8, l: &Limits) -> Result<usize> {
        let cap = match t {
            tag::WELCOME => 16,
            tag::REFUSED | tag::ERROR | tag::BUSY => 4 + MAX_MESSAGE_BYTES,
            tag::OK => 0,
            tag::VALUE => 5usize.saturating_add(l.max_value_bytes),
            // Many values at once: bounded only by the u32 length; each value
            // is still checked against the cap as it is decoded.
            tag::VALUES => u32::MAX as usize,
            tag::TIMED_OUT | tag::EXISTS => l.list_cap(),
            tag::COUNTER => 8,
            tag::DELETED => 1,
            _ => return Err(proto(format!("unknown response tag 0x{t:02x}"))),
        };
        Ok(cap.saturating_add(1))
    }

    fn check_prefix(t: u8, p: &[u8], l: &Limits) -> Result<()> {
        // Only `Values` has a frame cap looser than its fields' caps.
        if t != tag::VALUES {
            return Ok(());
        }
        let Some(count) = len_at(p, 0) else {
            return Ok(());
        };
        let mut at = 4usize;
        for _ in 0..count {
            let Some(n) = len_at(p, at) else {
                return Ok(());
            };
            if n > l.max_value_bytes {
                return Err(too_long("Values", "value", n, l.max_value_bytes));
            }
            at = at.saturating_add(4).saturating_add(n);
        }
        Ok(())
    }

    fn decode_body(t: u8, body: &[u8], l: &Limits) -> Result<Self> {
        let mut b = Body {
            rest: body,
            what: response_name(t),
        };
        let msg = match t {
            tag::WELCOME => Response::Welcome {
                max_key_bytes: b.u64()?,
                max_value_bytes: b.u64()?,
            },
            tag::REFUSED => Response::Refused(b.string(MAX_MESSAGE_BYTES, "message")?),
            tag::BUSY => Response::Busy(b.string(MAX_MESSAGE_BYTES, "message")?),
            tag::OK => Response::Ok,
            tag::VALUE => {
                if b.bool()? {
                    Response::Value(Some(b.bytes(l.max_value_bytes, "value")?.to_vec()))
                } else {
                    Response::Value(None)
                }
            }
            tag::VALUES => {
                let n = b.count(4)?;
                let mut vals = reserve(n);
                for _ in 0..n {
                    vals.push(b.bytes(l.max_value_bytes, "value")?.to_vec());
                }
                Response::Values(vals)
            }
            tag::TIMED_OUT => Response::TimedOut {
                missing: b.keys(l)?,
            },
            tag::EXISTS => {
                let n = b.count(1)?;
                let mut v = reserve(n);
                for _ in 0..n {
                    v.push(b.bool()?);
                }
                Response::Exists(v)
            }
            tag::COUNTER => Response::Counter(b.i64()?),
            tag::DELETED => Response::Deleted(b.bool()?),
            tag::ERROR => Response::Error(b.string(MAX_MESSAGE_BYTES, "message")?),
            _ => return Err(proto(format!("unknown response tag 0x{t:02x}"))),
        };
        b.end()?;
        Ok(msg)
    }

    fn encode(&self) -> Result<Vec<u8>> {
        let out = match self {
            Response::Welcome {
                max_key_bytes,
                max_value_bytes,
            } => {
                let mut o = begin(tag::WELCOME, 16);
                o.extend_from_slice(&max_key_bytes.to_le_bytes());
                o.extend_from_slice(&max_value_bytes.to_le_bytes());
                o
            }
            Response::Refused(m) | Response::Error(m) | Response::Busy(m) => {
                let t = match self {
                    Response::Refused(_) => tag::REFUSED,
                    Response::Busy(_) => tag::BUSY,
                    _ => tag::ERROR,
                };
                // Messages are advisory; cut rather than refuse to send them.
                let m = truncate_utf8(m, MAX_MESSAGE_BYTES);
                let mut o = begin(t, 4 + m.len());
                put_bytes(&mut o, m.as_bytes())?;
                o
            }
            Response::Ok => begin(tag::OK, 0),
            Response::Value(v) => {
                let mut o = begin(tag::VALUE, 5 + v.as_ref().map_or(0, Vec::len));
                match v {
                    Some(v) => {
                        o.push(1);
                        put_bytes(&mut o, v)?;
                    }
                    None => o.push(0),
                }
                o
            }
            Response::Values(vals) => {
                let mut o = begin(tag::VALUES, list_size(vals));
                put_list(&mut o, vals)?;
                o
            }
            Response::TimedOut { missing } => {
                let mut o = begin(tag::TIMED_OUT, list_size(missing));
                put_list(&mut o, missing)?;
                o
            }
            Response::Exists(v) => {
                let mut o = begin(tag::EXISTS, 4 + v.len());
                put_len(&mut o, v.len())?;
                o.extend(v.iter().map(|&b| u8::from(b)));
                o
            }
            Response::Counter(n) => {
                let mut o = begin(tag::COUNTER, 8);
                o.extend_from_slice(&n.to_le_bytes());
                o
            }
            Response::Deleted(d) => {
                let mut o = begin(tag::DELETED, 1);
                o.push(u8::from(*d));
                o
            }
        };
        finish(out)
    }

    fn name(&self) -> &'static str {
        match self {
            Response::Welcome { .. } => "Welcome",
            Response::Refused(_) => "Refused",
            Response::Busy(_) => "Busy",
            Response::Ok => "Ok",
            Response::Value(_) => "Value",
            Response::Values(_) => "Values",
            Response::TimedOut { .. } => "TimedOut",
            Response::Exists(_) => "Exists",
            Response::Counter(_) => "Counter",
            Response::Deleted(_) => "Deleted",
            Response::Error(_) => "Error",
        }
    }
}

/// An empty list with room for `n` items, but never more than
/// [`RESERVE_MAX`]: the count is the peer's claim, the items are not yet read.
fn reserve<T>(n: usize) -> Vec<T> {
    Vec::with_capacity(n.min(RESERVE_MAX))
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Incremental decoder: feed it bytes as they arrive, take frames out.
///
/// After an error the stream has lost its framing, so the decoder keeps
/// returning that error; the caller drops the connection.
pub struct Decoder<M> {
    buf: Vec<u8>,
    limits: Limits,
    /// The largest body any tag may declare under `limits` (see
    /// [`Decoder::any_cap`]), computed when the limits are set: asking all
    /// 256 tags on every frame cost 10 µs a frame.
    any_cap: usize,
    /// Until the peer has authenticated, no frame may be larger than a Hello.
    hello_only: bool,
    failed: Option<Error>,
    _msg: PhantomData<fn() -> M>,
}

impl<M: Message> Decoder<M> {
    pub fn new(limits: Limits) -> Self {
        Decoder {
            buf: Vec::new(),
            limits,
            any_cap: Self::any_cap(&limits),
            hello_only: false,
            failed: None,
            _msg: PhantomData,
        }
    }

    /// A decoder for a peer that has not authenticated yet: every frame over
    /// [`MAX_HELLO_BODY`] is refused on its length, so at most a Hello's worth
    /// of a stranger's bytes is ever buffered. [`Decoder::authenticated`]
    /// lifts this.
    pub fn hello_only(limits: Limits) -> Self {
        let mut d = Self::new(limits);
        d.hello_only = true;
        d
    }

    /// The peer has authenticated: frames up to the configured limits.
    pub fn authenticated(&mut self) {
        self.hello_only = false;
    }

    /// Most bytes to read next before calling [`Decoder::next_frame`] again,
    /// if the decoder must not buffer more than one frame could hold:
    /// before authentication, what is left of the largest Hello.
    pub fn read_budget(&self) -> Option<usize> {
        self.hello_only
            .then(|| (4 + MAX_HELLO_BODY).saturating_sub(self.buf.len()))
    }

    /// Changes the caps for frames not yet decoded (the client learns the
    /// server's caps from its welcome).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
        self.any_cap = Self::any_cap(&limits);
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Appends bytes received from the peer. Call [`Decoder::next_frame`]
    /// after every push so that an oversized header is caught before the
    /// frame's body accumulates.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let need = self.buf.len().saturating_add(bytes.len());
        if need > self.buf.capacity() {
            // Double as `Vec` would (so a large frame costs few copies), but
            // never past the end of the frame being received: a 16 MiB value
            // then holds 16 MiB, not the 32 MiB the doubling would reach.
            let doubled = self.buf.capacity().saturating_mul(2).max(need);
            let target = match len_at(&self.buf, 0) {
                Some(len) => doubled.min(len.saturating_add(4)).max(need),
                None => doubled,
            };
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Whether part of a frame is buffered (a disconnect now is abrupt).
    pub fn is_mid_frame(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<M>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.try_next() {
            Ok(m) => Ok(m),
            Err(e) => {
                self.buf = Vec::new();
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// The largest body any tag may declare, checked on the length alone so
    /// that the outcome does not depend on whether the tag byte has arrived.
    fn any_cap(limits: &Limits) -> usize {
        (0..=u8::MAX)
            .filter_map(|t| M::frame_cap(t, limits).ok())
            .max()
            .unwrap_or(0)
    }

    fn try_next(&mut self) -> Result<Option<M>> {
        let Some(len) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len == 0 {
            return Err(proto(format!("empty {} frame (no tag)", M::KIND)));
        }
        if self.hello_only && len > MAX_HELLO_BODY {
            return Err(proto(format!(
                "{} frame of {len} bytes before authentication; only a Hello (at most {MAX_HELLO_BODY} bytes) is accepted until the job token is presented",
                M::KIND
            )));
        }
        let any = self.any_cap;
        if len > any {
            return Err(proto(format!(
                "{} frame of {len} bytes exceeds the largest allowed ({any} bytes; max_key_bytes {}, max_value_bytes {})",
                M::KIND,
                self.limits.max_key_bytes,
                self.limits.max_value_bytes
            )));
        }
        let Some(&t) = self.buf.get(4) else {
            return Ok(None);
        };
        let cap = M::frame_cap(t, &self.limits)?;
        if len > cap {
            return Err(proto(format!(
                "{} {} frame of {len} bytes exceeds its limit of {cap} bytes (max_key_bytes {}, max_value_bytes {})",
                M::KIND,
                name_of::<M>(t),
                self.limits.max_key_bytes,
                self.limits.max_value_bytes
            )));
        }
        let total = 4 + len;
        let body = &self.buf[HEADER_LEN..self.buf.len().min(total)];
        M::check_prefix(t, body, &self.limits)?;
        if self.buf.len() < total {
            return Ok(None);
        }
        let msg = M::decode_body(t, &self.buf[HEADER_LEN..total], &self.limits)?;
        self.buf.drain(..total);
        if self.buf.is_empty() && self.buf.capacity() > (1 << 20) {
            // Don't pin a 16 MiB buffer for the rest of the connection.
            self.buf = Vec::new();
        }
        Ok(Some(msg))
    }
}

fn name_of<M: Message>(t: u8) -> &'static str {
    if M::KIND == Request::KIND {
        request_name(t)
    } else {
        response_name(t)
    }
}

/// Decodes all complete frames in `bytes` at once (for tests and tools).
pub fn decode_all<M: Message>(bytes: &[u8], limits: Limits) -> Result<Vec<M>> {
    let mut d = Decoder::<M>::new(limits);
    d.push(bytes);
    let mut out = Vec::new();
    while let Some(m) = d.next_frame()? {
        out.push(m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SMALL: Limits = Limits {
        max_key_bytes: 24,
        max_value_bytes: 200,
    };

    fn key() -> impl Strategy<Value = String> {
        "[a-z0-9/_\u{e9}\u{4e2d}]{0,8}"
    }

    fn keys() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(key(), 0..6)
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..=SMALL.max_value_bytes)
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (any::<u32>(), ".{0,40}")
                .prop_map(|(version, token)| Request::Hello { version, token }),
            (key(), value()).prop_map(|(key, value)| Request::Set { key, value }),
            key().prop_map(|key| Request::Get { key }),
            (keys(), any::<u64>())
                .prop_map(|(keys, timeout_ms)| Request::Wait { keys, timeout_ms }),
            keys().prop_map(|keys| Request::Check { keys }),
            (key(), any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
            key().prop_map(|key| Request::Delete { key }),
        ]
    }

    fn response() -> impl Strategy<Value = Response> {
        prop_oneof![
            (any::<u64>(), any::<u64>()).prop_map(|(max_key_bytes, max_value_bytes)| {
                Response::Welcome {
                    max_key_bytes,
                    max_value_bytes,
                }
            }),
            ".{0,40}".prop_map(Response::Refused),
            ".{0,40}".prop_map(Response::Busy),
            Just(Response::Ok),
            prop::option::of(value()).prop_map(Response::Value),
            prop::collection::vec(value(), 0..4).prop_map(Response::Values),
            keys().prop_map(|missing| Response::TimedOut { missing }),
            prop::collection::vec(any::<bool>(), 0..20).prop_map(Response::Exists),
            any::<i64>().prop_map(Response::Counter),
            any::<bool>().prop_map(Response::Deleted),
            ".{0,40}".prop_map(Response::Error),
        ]
    }

    /// Frames decoded then the error (as text) if any: what a reader sees.
    fn whole<M: Message>(bytes: &[u8]) -> (Vec<M>, Option<String>) {
        let mut d = Decoder::<M>::new(SMALL);
        d.push(bytes);
        drain(&mut d)
    }

    fn drain<M: Message>(d: &mut Decoder<M>) -> (Vec<M>, Option<String>) {
        let mut out = Vec::new();
        loop {
            match d.next_frame() {
                Ok(Some(m)) => out.push(m),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
    }

    fn chunked<M: Message>(bytes: &[u8], cuts: &[usize]) -> (Vec<M>, Option<String>) {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut d = Decoder::<M>::new(SMALL);
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            d.push(&bytes[prev..c]);
            prev = c;
            let (mut got, err) = drain(&mut d);
            out.append(&mut got);
            if err.is_some() {
                return (out, err);
            }
        }
        (out, None)
    }

    fn concat<M: Message>(msgs: &[M]) -> Vec<u8> {
        msgs.iter()
            .flat_map(|m| m.encode().unwrap_or_default())
            .collect()
    }

    /// Frames whose header is right and whose tag is usually a known one,
    /// with arbitrary bodies: far likelier to decode than arbitrary bytes.
    fn framed_junk() -> impl Strategy<Value = Vec<u8>> {
        let t = prop_oneof![0x01u8..=0x07, 0x80u8..=0x8a, any::<u8>()];
        let frame = (t, prop::collection::vec(any::<u8>(), 0..48)).prop_map(|(t, body)| {
            let mut f = ((body.len() + 1) as u32).to_le_bytes().to_vec();
            f.push(t);
            f.extend_from_slice(&body);
            f
        });
        prop::collection::vec(frame, 1..6).prop_map(|fs| fs.concat())
    }

    /// Feeds `bytes` the way the server does before authentication: never
    /// more than the decoder's read budget, in pieces of at most `chunk`.
    /// Returns what a reader sees and the most the decoder ever buffered.
    fn hello_only_feed(bytes: &[u8], chunk: usize) -> ((Vec<Request>, Option<String>), usize) {
        let mut d = Decoder::<Request>::hello_only(SMALL);
        let (mut out, mut most, mut at) = (Vec::new(), 0, 0);
        while at < bytes.len() {
            let budget = d.read_budget().unwrap_or(usize::MAX).max(1);
            let n = chunk.max(1).min(budget).min(bytes.len() - at);
            d.push(&bytes[at..at + n]);
            at += n;
            most = most.max(d.buf.len());
            let (mut got, err) = drain(&mut d);
            out.append(&mut got);
            if err.is_some() {
                return ((out, err), most);
            }
        }
        ((out, None), most)
    }

    proptest! {
        #[test]
        fn decoded_frames_reencode_to_the_bytes_they_came_from(
            junk in framed_junk(),
            raw in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            for bytes in [&junk, &raw] {
                let (reqs, _) = whole::<Request>(bytes);
                prop_assert!(bytes.starts_with(&concat(&reqs)));
                let (resps, _) = whole::<Response>(bytes);
                prop_assert!(bytes.starts_with(&concat(&resps)));
            }
        }

        #[test]
        fn hello_only_decoder_never_holds_more_than_a_hello(
            junk in framed_junk(),
            len in any::<u32>(),
            tag in any::<u8>(),
            tail in prop::collection::vec(any::<u8>(), 0..9000),
            chunk in 1usize..70_000,
        ) {
            // Any announced length, any tag, and up to twice a Hello of body.
            let mut forged = len.to_le_bytes().to_vec();
            forged.push(tag);
            forged.extend_from_slice(&tail);
            for bytes in [&junk, &forged] {
                let (seen, most) = hello_only_feed(bytes, chunk);
                prop_assert!(most <= 4 + MAX_HELLO_BODY, "buffered {} bytes", most);
                // Pacing by the budget changes nothing about what decodes.
                let mut d = Decoder::<Request>::hello_only(SMALL);
                d.push(bytes);
                prop_assert_eq!(seen, drain(&mut d));
            }
        }

        #[test]
        fn request_roundtrip(msgs in prop::collection::vec(request(), 1..5)) {
            let bytes = concat(&msgs);
            prop_assert_eq!(decode_all::<Request>(&bytes, SMALL)?, msgs);
        }

        #[test]
        fn response_roundtrip(msgs in prop::collection::vec(response(), 1..5)) {
            let bytes = concat(&msgs);
            prop_assert_eq!(decode_all::<Response>(&bytes, SMALL)?, msgs);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = whole::<Request>(&bytes);
            let _ = whole::<Response>(&bytes);
        }

        #[test]
        fn corrupted_frames_never_panic(
            reqs in prop::collection::vec(request(), 1..3),
            resps in prop::collection::vec(response(), 1..3),
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            for mut bytes in [concat(&reqs), concat(&resps)] {
                for &(at, x) in &flips {
                    let n = bytes.len();
                    bytes[at % n] ^= x | 1;
                }
                let _ = whole::<Request>(&bytes);
                let _ = whole::<Response>(&bytes);
                let n = cut % (bytes.len() + 1);
                let _ = whole::<Request>(&bytes[..n]);
                let _ = whole::<Response>(&bytes[..n]);
            }
        }

        #[test]
        fn split_decoding_equals_whole(
            reqs in prop::collection::vec(request(), 1..4),
            resps in prop::collection::vec(response(), 1..4),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            flip in prop::option::of((any::<usize>(), any::<u8>())),
        ) {
            let mut rq = concat(&reqs);
            let mut rs = concat(&resps);
            if let Some((at, x)) = flip {
                let n = rq.len();
                rq[at % n] ^= x;
                let n = rs.len();
                rs[at % n] ^= x;
            }
            prop_assert_eq!(chunked::<Request>(&rq, &cuts), whole::<Request>(&rq));
            prop_assert_eq!(chunked::<Response>(&rs, &cuts), whole::<Response>(&rs));
            // Byte by byte, the most fragmented delivery possible.
            let every: Vec<usize> = (0..rq.len()).collect();
            prop_assert_eq!(chunked::<Request>(&rq, &every), whole::<Request>(&rq));
        }

        #[test]
        fn oversized_is_refused_on_the_header(extra in 1usize..1000, key in key()) {
            let req = Request::Set { key, value: vec![7; SMALL.max_value_bytes + extra] };
            let bytes = req.encode()?;
            let mut d = Decoder::<Request>::new(SMALL);
            // Only up to the value's length: the decoder must not wait for
            // the value itself to arrive.
            let upto = HEADER_LEN + 4 + req_key_len(&req) + 4;
            d.push(&bytes[..upto]);
            let err = d.next_frame();
            prop_assert!(matches!(err, Err(Error::Protocol(_))), "{:?}", err);
        }
    }

    fn req_key_len(r: &Request) -> usize {
        match r {
            Request::Set { key, .. } => key.len(),
            _ => 0,
        }
    }

    #[test]
    fn oversized_values_response_is_refused_before_the_value() {
        let r = Response::Values(vec![vec![1; 10], vec![2; SMALL.max_value_bytes + 1]]);
        let bytes = r.encode().unwrap();
        let mut d = Decoder::<Response>::new(SMALL);
        d.push(&bytes[..HEADER_LEN + 4 + 4 + 10 + 4]);
        let err = d.next_frame().unwrap_err();
        assert!(err.to_string().contains("value of 201 bytes"), "{err}");
    }

    #[test]
    fn oversized_key_is_refused_inside_the_frame() {
        // Frame within the Set cap, but the key alone is over max_key_bytes.
        let req = Request::Set {
            key: "k".repeat(SMALL.max_key_bytes + 1),
            value: vec![],
        };
        let err = decode_all::<Request>(&req.encode().unwrap(), SMALL).unwrap_err();
        assert!(err.to_string().contains("key of 25 bytes"), "{err}");
    }

    #[test]
    fn huge_declared_length_is_refused_with_four_bytes() {
        let mut d = Decoder::<Request>::new(Limits::default());
        d.push(&u32::MAX.to_le_bytes());
        assert!(matches!(d.next_frame(), Err(Error::Protocol(_))));
        // The failure sticks: framing is lost.
        d.push(&Request::Get { key: "a".into() }.encode().unwrap());
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn hello_only_refuses_a_large_frame_on_its_length_and_accepts_a_hello() {
        let mut d = Decoder::<Request>::hello_only(Limits::default());
        d.push(&((16u32 << 20) + 13).to_le_bytes());
        let err = d.next_frame().unwrap_err().to_string();
        assert!(err.contains("before authentication"), "{err}");
        // The largest Hello still fits, and after it the configured caps hold.
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            token: "t".repeat(MAX_TOKEN_BYTES),
        };
        let set = Request::Set {
            key: "k".into(),
            value: vec![1; 100_000],
        };
        let mut d = Decoder::<Request>::hello_only(Limits::default());
        let hb = hello.encode().unwrap();
        assert_eq!(hb.len(), 4 + MAX_HELLO_BODY);
        d.push(&hb);
        assert_eq!(d.next_frame().unwrap(), Some(hello));
        d.authenticated();
        assert_eq!(d.read_budget(), None);
        d.push(&set.encode().unwrap());
        assert_eq!(d.next_frame().unwrap(), Some(set));
    }

    #[test]
    fn buffer_grows_no_further_than_the_frame_being_received() {
        let set = Request::Set {
            key: "k".into(),
            value: vec![3; (1 << 20) + 100],
        };
        let bytes = set.encode().unwrap();
        let mut d = Decoder::<Request>::new(Limits::default());
        for c in bytes.chunks(64 * 1024) {
            d.push(c);
            // Doubling alone would reach 2 MiB for this 1 MiB frame.
            assert!(d.buf.capacity() <= bytes.len(), "{}", d.buf.capacity());
        }
        assert_eq!(d.next_frame().unwrap(), Some(set));
    }

    #[test]
    fn forged_count_does_not_allocate() {
        // A Check frame claiming 2^32-1 keys in 4 bytes of payload.
        let mut f = vec![5, 0, 0, 0, tag::CHECK];
        f.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = decode_all::<Request>(&f, Limits::default()).unwrap_err();
        assert!(err.to_string().contains("count"), "{err}");
    }

    #[test]
    fn long_error_message_is_truncated_not_refused() {
        let m = "\u{e9}".repeat(MAX_MESSAGE_BYTES);
        let enc = Response::Error(m).encode().unwrap();
        match decode_all::<Response>(&enc, Limits::default())
            .unwrap()
            .as_slice()
        {
            [Response::Error(s)] => assert!(s.len() <= MAX_MESSAGE_BYTES),
            other => panic!("{other:?}"),
        }
    }
}
