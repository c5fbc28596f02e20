//! The test script's closing line (`scripts/test-summary.awk`), run by the
//! real awk on logs shaped like cargo's and pytest's output: it must count
//! a failing test binary that has no libtest harness, and its exit status
//! must agree with what it says.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The summary line and exit status for `log` (and the stages' statuses).
fn summarize(log: &str, stages: &str) -> (String, i32) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test-summary.awk");
    // One directory per call: the tests run in parallel threads of one
    // process, and each removes its directory when done.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gw-summary-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(log.as_bytes())
        .unwrap();
    let out = Command::new("awk")
        .arg("-v")
        .arg(format!("stages={stages}"))
        .arg("-f")
        .arg(script)
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("running awk");
    let _ = std::fs::remove_dir_all(&dir);
    (
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        out.status.code().unwrap_or(-1),
    )
}

const GOOD: &str = "\
     Running unittests src/lib.rs (target/debug/deps/gw_transport-1)
test result: ok. 78 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.2s
     Running tests/gwrun.rs (target/debug/deps/gwrun-2)
test result: ok. 23 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.2s
..........................                                               [100%]
26 passed in 19.92s
";

#[test]
fn a_clean_run_says_so_and_exits_0() {
    let (line, code) = summarize(GOOD, "");
    assert_eq!(line, "tests: 127 passed, 0 failed, 1 skipped");
    assert_eq!(code, 0);
}

#[test]
fn a_failing_binary_without_a_harness_is_counted_and_named() {
    // What cargo prints when collectives/tests/no_alloc.rs (harness = false)
    // exits 1: its own lines, no "test result:", and cargo's error.
    let log = format!(
        "{GOOD}     Running tests/no_alloc.rs (target/debug/deps/no_alloc-3)
tcp world 3 all-reduce rd count 40000: 8 allocations (116224 bytes) in 50 steps
error: test failed, to rerun pass `-p gw-collectives --test no_alloc`

Caused by:
  process didn't exit successfully: `no_alloc-3 --test-threads=2` (exit status: 1)
"
    );
    let (line, code) = summarize(&log, "");
    assert_eq!(
        line,
        "tests: 127 passed, 0 failed, 1 skipped; failing targets: 1 (-p gw-collectives --test no_alloc)"
    );
    assert_eq!(code, 1);
}

#[test]
fn failing_tests_and_python_failures_are_counted() {
    let log = "\
test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s
error: test failed, to rerun pass `-p gw-tests --test netns`
=========== 1 failed, 25 passed in 20.01s ===========
";
    let (line, code) = summarize(log, "");
    assert_eq!(
        line,
        "tests: 30 passed, 3 failed; failing targets: 2 (-p gw-tests --test netns, python tests)"
    );
    assert_eq!(code, 1);
}

#[test]
fn a_stage_that_failed_without_naming_a_target_is_named() {
    let (line, code) = summarize(GOOD, "integration tests=101,python tests=0");
    assert_eq!(
        line,
        "tests: 127 passed, 0 failed, 1 skipped; failing targets: 1 (integration tests (exit 101))"
    );
    assert_eq!(code, 1);
}
