//! `GW_TRACE=FILE`: a Chrome-trace timeline of what each rank did, to put
//! beside `gwbench model`'s breakdown (open it in Perfetto or
//! chrome://tracing).
//!
//! Off, it costs one relaxed atomic load per operation and per transfer,
//! and allocates nothing. On, the engine records complete ("X") events in
//! memory — each collective (thread 0, with its sequence number and bytes),
//! each send and receive from posting to completion (thread 1, with the
//! peer and bytes), each wait of the caller (thread 2), and the spans the
//! program reports of its own work through [`crate::trace_span`], such as
//! gwtrain's compute of each step (thread 3) — and the
//! communicator appends them to FILE when it closes. Ranks are processes
//! (`pid` = rank) on one clock (microseconds since the Unix epoch), so
//! every rank's events land in one file. The format is Chrome's JSON array
//! whose closing `]` is optional, which lets ranks append without
//! coordinating: the first to arrive creates the file with its `[` in one
//! atomic link, and each rank's events go in with one append. Rank 0
//! removes an old file at init, before any rank can have written to it.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

static ON: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<State> = Mutex::new(State {
    rank: 0,
    events: Vec::new(),
    dropped: 0,
});
static CLOCK: OnceLock<(Instant, f64)> = OnceLock::new();

/// Distinct names [`intern`] keeps (each leaked once, for the process).
pub const MAX_NAMES: usize = 64;
static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// `name` as a `&'static str`: the first [`MAX_NAMES`] distinct names are
/// kept for good; any other is `compute`.
pub(crate) fn intern(name: &str) -> &'static str {
    let Ok(mut names) = NAMES.lock() else {
        return "compute";
    };
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    if names.len() >= MAX_NAMES {
        return "compute";
    }
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(kept);
    kept
}

/// Events kept per process; past it they are counted, not stored.
const MAX_EVENTS: usize = 1 << 20;

struct State {
    rank: u32,
    events: Vec<Event>,
    dropped: u64,
}

/// Which lane of a rank's timeline an event goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Collective = 0,
    Transfer = 1,
    Wait = 2,
    Compute = 3,
    /// Point-to-point messages, which run beside the collectives (a lane
    /// of their own, since a viewer cannot draw overlapping slices on one).
    Message = 4,
}

struct Event {
    name: &'static str,
    lane: Lane,
    ts: f64,
    dur: f64,
    seq: u64,
    bytes: u64,
    peer: Option<u32>,
}

#[inline]
pub(crate) fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Microseconds since the Unix epoch, monotonic within the process.
pub(crate) fn now_us() -> f64 {
    let (origin, epoch_us) = *CLOCK.get_or_init(|| {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (Instant::now(), since.as_secs_f64() * 1e6)
    });
    epoch_us + origin.elapsed().as_secs_f64() * 1e6
}

/// Starts recording for `rank`; rank 0 removes what an earlier run left.
pub(crate) fn start(rank: u32, path: &str) {
    if rank == 0 {
        let _ = std::fs::remove_file(path);
    }
    let _ = now_us();
    if let Ok(mut s) = STATE.lock() {
        s.rank = rank;
    }
    ON.store(true, Ordering::Relaxed);
}

/// Records an event that began at `start_us` and ends now.
pub(crate) fn record(
    name: &'static str,
    lane: Lane,
    start_us: f64,
    seq: u64,
    bytes: u64,
    peer: Option<u32>,
) {
    let end = now_us();
    if let Ok(mut s) = STATE.lock() {
        if s.events.len() >= MAX_EVENTS {
            s.dropped += 1;
            return;
        }
        s.events.push(Event {
            name,
            lane,
            ts: start_us,
            dur: (end - start_us).max(0.0),
            seq,
            bytes,
            peer,
        });
    }
}

/// Appends the events recorded so far to `path` and clears them.
pub(crate) fn flush(path: &str) -> std::io::Result<()> {
    let (rank, events, dropped) = match STATE.lock() {
        Ok(mut s) => (
            s.rank,
            std::mem::take(&mut s.events),
            std::mem::take(&mut s.dropped),
        ),
        Err(_) => return Ok(()),
    };
    let mut text = String::with_capacity(events.len() * 120 + 256);
    use std::fmt::Write as _;
    for (lane, name) in [
        (0, "collectives"),
        (1, "transfers"),
        (2, "waits"),
        (3, "compute"),
        (4, "messages"),
    ] {
        let _ = writeln!(
            text,
            r#"{{"name":"thread_name","ph":"M","pid":{rank},"tid":{lane},"args":{{"name":"{name}"}}}},"#
        );
    }
    let _ = writeln!(
        text,
        r#"{{"name":"process_name","ph":"M","pid":{rank},"tid":0,"args":{{"name":"rank {rank}","dropped_events":{dropped}}}}},"#
    );
    for e in &events {
        let peer = e.peer.map_or(String::new(), |p| format!(r#","peer":{p}"#));
        let _ = writeln!(
            text,
            r#"{{"name":"{}","cat":"gradwire","ph":"X","pid":{rank},"tid":{},"ts":{:.3},"dur":{:.3},"args":{{"seq":{},"bytes":{}{peer}}}}},"#,
            e.name, e.lane as u8, e.ts, e.dur, e.seq, e.bytes
        );
    }
    if !std::path::Path::new(path).exists() {
        let tmp = format!("{path}.{}.start", std::process::id());
        std::fs::write(&tmp, "[\n")?;
        // Linking fails if another rank's file got there first: fine.
        let _ = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
    }
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_land_in_a_chrome_trace_that_two_ranks_can_share() {
        let dir = std::env::temp_dir().join(format!("gw-trace-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("t.json");
        let path = path.to_str().expect("utf-8");
        std::fs::write(path, "stale").expect("stale file");
        start(0, path);
        assert!(
            !std::path::Path::new(path).exists(),
            "rank 0 removes an old trace"
        );
        // Other tests of this process may record too: ours carry this seq.
        const SEQ: u64 = 0xFEED_F00D;
        let t0 = now_us();
        record("all_reduce", Lane::Collective, t0, SEQ, 4096, None);
        record("send", Lane::Transfer, t0, SEQ, 2048, Some(1));
        crate::trace_span("compute", std::time::Instant::now(), SEQ);
        record("send/recv", Lane::Message, t0, SEQ, 0, None);
        flush(path).expect("flush");
        // A second rank appends to the same file.
        if let Ok(mut s) = STATE.lock() {
            s.rank = 1;
        }
        record("recv", Lane::Transfer, now_us(), SEQ, 2048, Some(0));
        flush(path).expect("flush");
        let text = std::fs::read_to_string(path).expect("read");
        // The optional `]` closes the array for a strict JSON reader.
        let json = format!("{}]", text.trim_end().trim_end_matches(','));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        let events: Vec<&serde_json::Value> = v
            .as_array()
            .expect("array")
            .iter()
            .filter(|e| e["ph"] == "X" && e["args"]["seq"] == SEQ)
            .collect();
        assert_eq!(events.len(), 5);
        assert_eq!(events[0]["name"], "all_reduce");
        assert_eq!(events[0]["args"]["bytes"], 4096);
        assert_eq!(events[1]["args"]["peer"], 1);
        assert_eq!(
            (&events[2]["name"], &events[2]["tid"]),
            (&"compute".into(), &3.into())
        );
        assert_eq!(
            (&events[3]["name"], &events[3]["tid"]),
            (&"send/recv".into(), &4.into())
        );
        assert_eq!(events[4]["pid"], 1);
        assert!(
            v.as_array()
                .expect("array")
                .iter()
                .any(|e| e["ph"] == "M" && e["tid"] == 4 && e["args"]["name"] == "messages"),
            "the messages lane is named"
        );
        assert!(
            events
                .iter()
                .all(|e| e["dur"].as_f64().unwrap_or(-1.0) >= 0.0)
        );
        ON.store(false, Ordering::Relaxed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_are_kept_once_and_bounded() {
        let a = intern("unit-forward");
        assert_eq!(a, "unit-forward");
        assert!(std::ptr::eq(a, intern("unit-forward")), "kept once");
        // Fill the table (other tests may have added names): the rest are
        // recorded as `compute`.
        for i in 0..MAX_NAMES {
            let _ = intern(&format!("unit-fill-{i}"));
        }
        assert_eq!(intern("unit-one-too-many"), "compute");
        assert!(NAMES.lock().map(|n| n.len()).unwrap_or(0) <= MAX_NAMES);
        assert_eq!(intern("unit-forward"), "unit-forward");
    }

    #[test]
    fn named_spans_check_their_arguments() {
        for bad in ["", "a\"b", "tab\there", &"x".repeat(65)] {
            assert!(crate::trace_span_named(bad, 0.1, 0).is_err(), "{bad:?}");
        }
        for secs in [-1.0, f64::NAN, f64::INFINITY, 86_400.0] {
            assert!(crate::trace_span_named("ok", secs, 0).is_err(), "{secs}");
        }
        assert!(crate::trace_span_named("fwd:layer-1/part_2.x", 0.0, 3).is_ok());
    }
}
