//! The C programs that measure the machine's own ceilings for the
//! comparisons (`bench/peers/memcpy_bw.c`, `cma_bw.c`) build warning-free
//! with the system's C compiler and report a rate for every kind of page
//! they offer; a bad argument is a usage error, not a number.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "common/cc.rs"]
mod cc;

fn build(name: &str) -> PathBuf {
    cc::build(&format!("peers/{name}.c"), "gw-ceilings")
}

/// `key=value` fields of a program's one output line.
fn field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {line:?}"))
}

fn run(exe: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(exe).args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn memcpy_bw_on_both_kinds_of_page() {
    let exe = build("memcpy_bw");
    for huge in ["0", "1"] {
        let (code, out, err) = run(&exe, &["3", "3", huge]);
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(field(&out, "bytes"), f64::from(3u32 << 20), "{out}");
        assert_eq!(field(&out, "huge"), huge.parse::<f64>().unwrap());
        let (gbps, min, max) = (field(&out, "gbps"), field(&out, "min"), field(&out, "max"));
        assert!(gbps > 0.0 && min <= gbps && gbps <= max, "{out}");
    }
    let (code, _, err) = run(&exe, &["3", "3", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("usage"), "{err}");
}

#[test]
fn cma_bw_for_every_placement_of_huge_pages() {
    let exe = build("cma_bw");
    for pages in ["0", "1", "2", "3"] {
        let (code, out, err) = run(&exe, &["2", pages]);
        assert_eq!(code, 0, "pages {pages}: {out}{err}");
        assert_eq!(field(&out, "bytes"), f64::from(2u32 << 20), "{out}");
        assert_eq!(field(&out, "pages"), pages.parse::<f64>().unwrap());
        assert!(field(&out, "cma_gbps") > 0.0, "{out}");
        assert!(field(&out, "memcpy_gbps") > 0.0, "{out}");
    }
    for bad in [
        &["2", "4"][..],
        &["0", "1"],
        &["2"],
        &["2", "x"],
        &["2000", "0"],
        &["2x", "0"],
    ] {
        let (code, _, err) = run(&exe, bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(err.contains("usage"), "{bad:?}: {err}");
    }
}
