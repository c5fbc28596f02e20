//! `bench/sockets/send_buffer_state.c`, the program behind the TCP send
//! buffer default (docs/performance.md, "TCP send buffers"), builds with
//! the system's C compiler without warnings, runs its two processes over
//! real loopback sockets with and without fixed buffers, checks the bytes
//! it moved, and refuses arguments it cannot honour.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/cc.rs"]
mod cc;

/// Built into a directory of the test's own, since tests run in parallel.
fn build(test: &str) -> PathBuf {
    cc::build(
        "sockets/send_buffer_state.c",
        &format!("gw-bench-sockets-{test}"),
    )
}

fn run(exe: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("send_buffer_state runs")
}

/// The medians line's B/A, A and B figures.
fn medians(stdout: &str) -> (f64, f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("median B/A "))
        .unwrap_or_else(|| panic!("no medians line in {stdout:?}"));
    let num = |after: &str| -> f64 {
        let rest = &line[line
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in {line:?}"))
            + after.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        rest[..end]
            .parse()
            .unwrap_or_else(|e| panic!("{after:?} in {line:?}: {e}"))
    };
    (num("median B/A "), num("; A "), num(", B "))
}

#[test]
fn runs_over_loopback_and_checks_its_bytes() {
    let exe = build("runs");
    for env in [&[][..], &[("SNDBUF", "262144"), ("RCVBUF", "1048576")][..]] {
        let out = run(&exe, &["65536", "1048576", "2", "20", "3"], env);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{env:?}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.trim_start().starts_with("round "))
                .count(),
            3,
            "{env:?}: {stdout}"
        );
        let (ratio, a, b) = medians(&stdout);
        assert!(ratio > 0.0 && a > 0.0 && b > 0.0, "{env:?}: {stdout}");
        assert!(stdout.contains("data ok"), "{env:?}: {stdout}");
    }
}

#[test]
fn refuses_what_it_cannot_run() {
    let exe = build("refuses");
    let out = run(&exe, &[], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
    for args in [
        ["65536", "1048576", "0", "20", "3"],  // no lanes
        ["65536", "1048576", "17", "20", "3"], // too many lanes
        ["65536", "1048576", "3", "20", "3"],  // not a multiple of the lanes
        ["1048576", "65536", "2", "20", "3"],  // big below small
        ["65536", "1048576", "2", "20", "65"], // too many rounds
    ] {
        let out = run(&exe, &args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("need 1..16 lanes"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
