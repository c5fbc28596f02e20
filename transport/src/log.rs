//! Minimal leveled logging controlled by `GW_DEBUG` (`warn`, `info`, `trace`).
//!
//! gradwire is a library loaded into other people's processes, so it must not
//! install a global logger of its own; these macros write straight to stderr,
//! prefixed with the rank when one is known.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
static RANK: AtomicI64 = AtomicI64::new(-1);

/// Verbosity levels, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Warn = 1,
    Info = 2,
    Trace = 3,
}

fn parse_level(s: &str) -> u8 {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "off" | "none" => 0,
        "warn" | "1" => 1,
        "info" | "2" => 2,
        "trace" | "3" | "debug" => 3,
        _ => 1,
    }
}

/// The current level, read once from `GW_DEBUG` (default: warnings only).
pub fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != u8::MAX {
        return l;
    }
    let l = std::env::var("GW_DEBUG")
        .map(|v| parse_level(&v))
        .unwrap_or(1);
    LEVEL.store(l, Ordering::Relaxed);
    l
}

/// Whether messages at `lvl` are printed.
pub fn enabled(lvl: Level) -> bool {
    level() >= lvl as u8
}

/// Records this process's rank so that log lines name it.
pub fn set_rank(rank: u32) {
    RANK.store(rank as i64, Ordering::Relaxed);
}

#[doc(hidden)]
pub fn emit(lvl: Level, args: std::fmt::Arguments<'_>) {
    let tag = match lvl {
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Trace => "TRACE",
    };
    let r = RANK.load(Ordering::Relaxed);
    if r >= 0 {
        eprintln!("gradwire {tag} rank {r}: {args}");
    } else {
        eprintln!("gradwire {tag}: {args}");
    }
}

/// Logs at warning level.
#[macro_export]
macro_rules! gw_warn {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Warn) { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) } };
}
/// Logs at info level (`GW_DEBUG=info`).
#[macro_export]
macro_rules! gw_info {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Info) { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) } };
}
/// Logs at trace level (`GW_DEBUG=trace`).
#[macro_export]
macro_rules! gw_trace {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Trace) { $crate::log::emit($crate::log::Level::Trace, format_args!($($t)*)) } };
}
