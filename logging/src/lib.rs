//! The one place gradwire's log lines are printed.
//!
//! Library code logs through `tracing` and never prints; a library must not
//! decide where a host program's output goes. Programs decide: gradwire's
//! binaries call [`init`] (or [`init_service`] for the long-running job
//! server and agent, whose lines carry a timestamp), and the C ABI calls
//! [`init_if_unset`], which installs the same subscriber only when the host
//! program has none, so C and Python users see the lines a Rust binary
//! prints. A Rust program that installs its own subscriber gets gradwire's
//! events with their spans' fields (`rank`, `comm`, `seq`) like any other.
//!
//! `GW_DEBUG` is the filter: `off`, `warn` (the default; `info` for services), `info`, `debug`,
//! `trace` (or `0`-`3`), or per-target directives such as
//! `warn,gw_transport::tcp=trace`.
//!
//! A line reads `gradwire WARN rank 3: message {seq=…, comm=…}`: the rank
//! first, as it always was, and the rest of the context after the message
//! (on INFO lines, which describe the set-up, the rank alone).

mod context;
mod line;

use std::io::Write;
use std::str::FromStr;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use context::{InSpan, enter};
pub use line::{LineLayer, Style};

/// The subscriber [`init`], [`init_service`] and [`init_if_unset`] install:
/// [`enter`] recognises it by its type.
type Installed = tracing_subscriber::layer::Layered<
    tracing_subscriber::filter::Filtered<LineLayer, Targets, tracing_subscriber::Registry>,
    tracing_subscriber::Registry,
>;

/// The subscriber gradwire installs, printing through `layer`.
fn subscriber(layer: LineLayer, filter: Targets) -> Installed {
    tracing_subscriber::registry().with(layer.with_filter_targets(filter))
}

/// The variable that sets the filter.
pub const DEBUG_VAR: &str = "GW_DEBUG";

/// Parses a `GW_DEBUG` value; `Err` says what was not understood.
pub fn parse_filter(text: &str) -> Result<Targets, String> {
    let t = text.trim();
    let level = match t.to_ascii_lowercase().as_str() {
        "" | "0" | "off" | "none" => Some(LevelFilter::OFF),
        "1" | "warn" => Some(LevelFilter::WARN),
        "2" | "info" => Some(LevelFilter::INFO),
        "3" | "trace" => Some(LevelFilter::TRACE),
        "debug" => Some(LevelFilter::DEBUG),
        "error" => Some(LevelFilter::ERROR),
        _ => None,
    };
    if let Some(l) = level {
        return Ok(Targets::new().with_default(l));
    }
    Targets::from_str(t).map_err(|e| {
        format!(
            "{DEBUG_VAR}={text:?} is not a level (off, warn, info, debug, trace) or a list of target=level directives: {e}"
        )
    })
}

/// The filter `GW_DEBUG` asks for, else `default`, and a complaint if it
/// could not be read (then `default`).
fn filter_from_env(default: LevelFilter) -> (Targets, Option<String>) {
    match std::env::var(DEBUG_VAR) {
        Err(_) => (Targets::new().with_default(default), None),
        Ok(v) => match parse_filter(&v) {
            Ok(t) => (t, None),
            Err(e) => (Targets::new().with_default(default), Some(e)),
        },
    }
}

fn install(style: Style, default: LevelFilter) -> bool {
    let (filter, complaint) = filter_from_env(default);
    let ok = subscriber(LineLayer::new(style, std::io::stderr), filter)
        .try_init()
        .is_ok();
    if let Some(c) = complaint {
        let _ = writeln!(
            std::io::stderr(),
            "gradwire WARN: {c}; logging warnings only"
        );
    }
    ok
}

/// Installs the stderr subscriber for one of gradwire's command-line
/// programs (no timestamps: lines read as they always have). Does nothing
/// if a subscriber is already installed.
pub fn init() {
    install(Style::plain("gradwire"), LevelFilter::WARN);
}

/// As [`init`], for a long-running service: each line starts with a UTC
/// timestamp and the service's name (`gwjob`, `gwjob agent`), and without
/// `GW_DEBUG` its INFO lines are printed too: they are the operator's record
/// of what the service did (nodes registered, workers started and reaped).
pub fn init_service(name: &'static str) {
    install(Style::timestamped(name), LevelFilter::INFO);
}

/// For libraries loaded by other programs (the C ABI): installs the stderr
/// subscriber only if the program has not installed one of its own.
/// Returns whether it installed it.
pub fn init_if_unset() -> bool {
    if tracing::dispatcher::has_been_set() {
        return false;
    }
    install(Style::plain("gradwire"), LevelFilter::WARN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn levels_numbers_and_directives_parse() {
        for (text, want) in [
            ("warn", LevelFilter::WARN),
            ("INFO", LevelFilter::INFO),
            ("2", LevelFilter::INFO),
            ("3", LevelFilter::TRACE),
            ("off", LevelFilter::OFF),
            ("", LevelFilter::OFF),
        ] {
            let t = parse_filter(text).unwrap();
            assert_eq!(t.default_level(), Some(want), "{text}");
        }
        let t = parse_filter("warn,gw_transport::tcp=trace").unwrap();
        assert!(t.would_enable("gw_transport::tcp::lane", &tracing::Level::TRACE));
        assert!(!t.would_enable("gw_collectives", &tracing::Level::INFO));
    }

    /// Lines printed while `body` runs under `sub`.
    fn lines<S>(sub: impl FnOnce(LineLayer) -> S, body: impl FnOnce()) -> String
    where
        S: tracing::Subscriber + Send + Sync + 'static,
    {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let layer = LineLayer::to_sink(Style::plain("gradwire"), move |b| {
            sink.lock().unwrap().extend_from_slice(b)
        });
        tracing::subscriber::with_default(sub(layer), body);
        String::from_utf8(out.lock().unwrap().clone()).unwrap()
    }

    fn comm(rank: u32, id: &str) -> tracing::Span {
        tracing::error_span!("comm", rank = rank, comm = id)
    }

    #[test]
    fn under_our_subscriber_enter_stands_in_for_the_span_and_restores_on_drop() {
        let warn = || Targets::new().with_default(LevelFilter::WARN);
        let got = lines(
            |l| subscriber(l, warn()),
            || {
                let (a, b) = (comm(3, "00aa"), comm(5, "00bb"));
                {
                    let _in_a = enter(&a);
                    // Not entered: the thread-local stands in for it.
                    assert!(tracing::Span::current().id().is_none());
                    tracing::warn!("in a");
                    {
                        let _in_b = enter(&b);
                        let op = tracing::error_span!("op", seq = 7);
                        let _o = op.enter();
                        tracing::warn!("in b");
                    }
                    tracing::warn!("a again");
                }
                tracing::warn!("outside");
            },
        );
        assert_eq!(
            got,
            "gradwire WARN rank 3: in a {comm=00aa}\n\
             gradwire WARN rank 5: in b {seq=7, comm=00bb}\n\
             gradwire WARN rank 3: a again {comm=00aa}\n\
             gradwire WARN: outside\n"
        );
    }

    #[test]
    fn under_another_subscriber_enter_enters_the_span() {
        let got = lines(
            |l| tracing_subscriber::registry().with(l),
            || {
                let a = comm(2, "0001");
                let _in_a = enter(&a);
                assert_eq!(tracing::Span::current().id(), a.id());
                tracing::warn!("entered");
            },
        );
        assert_eq!(got, "gradwire WARN rank 2: entered {comm=0001}\n");
    }

    #[test]
    fn a_disabled_span_gives_no_context() {
        let off = || Targets::new().with_default(LevelFilter::OFF);
        let got = lines(
            |l| subscriber(l, off()),
            || {
                let a = comm(1, "0002");
                assert!(a.is_disabled());
                let _in_a = enter(&a);
                tracing::warn!("not printed");
            },
        );
        assert_eq!(got, "");
    }

    #[test]
    fn nonsense_is_named() {
        let e = parse_filter("loud=please").unwrap_err();
        assert!(e.contains("GW_DEBUG=\"loud=please\""), "{e}");
    }
}
