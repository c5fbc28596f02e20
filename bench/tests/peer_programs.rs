//! The peer programs of `scripts/compare-collectives.py` compute what
//! they time: `bench/peers/mpi_coll.c` and `mpi_p2p.c`, built with
//! OpenMPI's compiler, and
//! `bench/peers/gloo_coll.py` (PyTorch's Gloo backend) run every
//! collective at 2 and 3 ranks (a size that is not a multiple of the
//! ranks' blocks included) and must report every element right and the
//! sizes gwbench's layout gives; `-T` sizes their loops. A benchmark that
//! times a wrong result, or another size than gwbench's, compares nothing.
//!
//! Needs OpenMPI (`mpicc.openmpi`, `mpirun.openmpi`) and torch;
//! `scripts/test.sh` installs both and sets `GW_TEST_MPI=required` and
//! `GW_TEST_TORCH=required`, so that in CI these tests cannot skip. Run by
//! hand without them they say so and pass.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const COLLS: [&str; 5] = [
    "allreduce",
    "reduce_scatter",
    "allgather",
    "broadcast",
    "reduce",
];

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `mpi_coll` built into a fresh directory, or `None` (said) without OpenMPI.
fn build() -> Option<PathBuf> {
    build_named("mpi_coll")
}

/// `bench/peers/NAME.c` built into a fresh directory, or `None` (said)
/// without OpenMPI.
fn build_named(name: &str) -> Option<PathBuf> {
    if !(have("mpicc.openmpi") && have("mpirun.openmpi")) {
        if std::env::var("GW_TEST_MPI").as_deref() == Ok("required") {
            panic!("GW_TEST_MPI=required but mpicc.openmpi or mpirun.openmpi is missing");
        }
        eprintln!(
            "peer_programs: OpenMPI is not installed; nothing checked (scripts/test.sh installs it)"
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("gw-peer-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("peers/{name}.c"));
    let out = Command::new("mpicc.openmpi")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lm")
        .output()
        .expect("run mpicc.openmpi");
    assert!(
        out.status.success(),
        "mpicc.openmpi failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// `mpirun -n RANKS mpi_coll ARGS...` over shared memory; its stdout.
///
/// OpenMPI 4.1's launcher sometimes reports a rank that finished
/// normally as "rank N with PID 0 ... exiting improperly" (a race in its
/// own shutdown, open-mpi/ompi#9389 and #12607), seen once in CI after
/// every result had printed. That exact report, and only it, is
/// launched again, at most twice; any other failure fails at once.
fn mpirun(exe: &Path, ranks: u32, args: &[&str]) -> String {
    let mut tries = 0;
    loop {
        tries += 1;
        let out = Command::new("mpirun.openmpi")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader"])
            .args(["-n", &ranks.to_string()])
            .arg(exe)
            .args(args)
            .output()
            .expect("run mpirun.openmpi");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return text;
        }
        let shutdown_race =
            |s: &str| s.contains("with PID 0 on") && s.contains("exiting improperly");
        if tries < 3 && (shutdown_race(&text) || shutdown_race(&err)) {
            eprintln!(
                "mpirun -n {ranks} mpi_coll {args:?}: OpenMPI's PID 0 shutdown report; launching again"
            );
            continue;
        }
        panic!("mpirun -n {ranks} mpi_coll {args:?} failed:\n{text}{err}");
    }
}

/// `python3 gloo_coll.py -n RANKS ARGS...`, or `None` (said) without
/// torch; its stdout and stderr, and whether it succeeded.
fn gloo(ranks: u32, args: &[&str]) -> Option<(bool, String, String)> {
    let torch = Command::new("python3")
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_gloo_available()",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !torch {
        if std::env::var("GW_TEST_TORCH").as_deref() == Ok("required") {
            panic!("GW_TEST_TORCH=required but torch with Gloo does not import");
        }
        eprintln!(
            "peer_programs: torch is not installed; Gloo not checked (scripts/test.sh installs it)"
        );
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/gloo_coll.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["-n", &ranks.to_string()])
        .args(args)
        .output()
        .expect("run python3");
    Some((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The `key=value` fields of the programs' result lines.
fn rows(text: &str) -> Vec<Vec<(String, String)>> {
    text.lines()
        .filter(|l| l.starts_with("mpi coll=") || l.starts_with("gloo coll="))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn field<'a>(row: &'a [(String, String)], key: &str) -> &'a str {
    row.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {row:?}"))
}

/// Checks one program's rows for `coll` at `ranks`: every element right,
/// gwbench's sizes, a time.
fn check_rows(text: &str, coll: &str, ranks: u32) {
    let got = rows(text);
    assert_eq!(got.len(), 3, "{coll} at {ranks}:\n{text}");
    let per_rank = matches!(coll, "reduce_scatter" | "allgather");
    for (row, asked) in got.iter().zip([8usize, 1000, 65536]) {
        assert_eq!(field(row, "coll"), coll);
        assert_eq!(field(row, "wrong"), "0", "{coll} at {ranks}: {row:?}");
        // gwbench's layout: whole 16-byte blocks per rank, at least one element.
        let elems = asked / 4;
        let want = if per_rank {
            (elems / ranks as usize / 4 * 4).max(1) * ranks as usize * 4
        } else {
            elems * 4
        };
        assert_eq!(field(row, "size"), want.to_string(), "{coll} {row:?}");
        let t: f64 = field(row, "time_us").parse().expect("time_us");
        assert!(t > 0.0 && t.is_finite(), "{row:?}");
    }
}

const SIZES: [&str; 3] = ["8:3:1", "1000:3:1", "65536:3:1"];

#[test]
fn every_collective_is_right_at_two_and_three_ranks() {
    let Some(exe) = build() else { return };
    for ranks in [2u32, 3] {
        for coll in COLLS {
            let text = mpirun(&exe, ranks, &[&[coll][..], &SIZES].concat());
            check_rows(&text, coll, ranks);
        }
    }
}

#[test]
fn gloo_every_collective_is_right_at_two_and_three_ranks() {
    // All five in one launch per world: each start imports torch.
    let all = COLLS.join(",");
    for ranks in [2u32, 3] {
        let Some((ok, text, err)) = gloo(ranks, &[&[all.as_str()][..], &SIZES].concat()) else {
            return;
        };
        assert!(ok, "gloo_coll -n {ranks} {all} failed:\n{text}{err}");
        for coll in COLLS {
            let mine: String = text
                .lines()
                .filter(|l| l.starts_with(&format!("gloo coll={coll} ")))
                .map(|l| format!("{l}\n"))
                .collect();
            check_rows(&mine, coll, ranks);
        }
    }
}

/// Arguments both programs must refuse: an unknown collective, no timed
/// call, a zero time target.
const BAD_ARGS: [&[&str]; 3] = [
    &["alltoall", "8:1:1"],
    &["allreduce", "8:0:1"],
    &["allreduce", "-T", "0", "8:1:1"],
];

/// The one row of an `allreduce -T 0.2 1024:1:1` run begun at `t0`: it
/// took at least the time target, and more than the one call asked for.
fn check_time_sized(text: &str, t0: Instant) {
    let got = rows(text);
    assert_eq!(got.len(), 1, "{text}");
    assert!(t0.elapsed() >= Duration::from_millis(200), "{text}");
    let iters: u64 = field(&got[0], "iters").parse().expect("iters");
    assert!(iters > 1, "-T 0.2 ran {iters} call(s): {text}");
}

#[test]
fn gloo_time_sized_loops_and_bad_arguments() {
    let t0 = Instant::now();
    let Some((ok, text, err)) = gloo(2, &["allreduce", "-T", "0.2", "1024:1:1"]) else {
        return;
    };
    assert!(ok, "{text}{err}");
    check_time_sized(&text, t0);
    for args in BAD_ARGS {
        let Some((ok, _, err)) = gloo(2, args) else {
            return;
        };
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains("gloo_coll: "), "{args:?}: {err}");
    }
}

#[test]
fn time_sized_loops_and_bad_arguments() {
    let Some(exe) = build() else { return };
    let t0 = Instant::now();
    let text = mpirun(&exe, 2, &["allreduce", "-T", "0.2", "1024:1:1"]);
    check_time_sized(&text, t0);
    for args in BAD_ARGS {
        let out = Command::new("mpirun.openmpi")
            .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
            .arg(&exe)
            .args(args)
            .output()
            .expect("run mpirun.openmpi");
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("mpi_coll: "),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `mpi_p2p`: every exchange checked, gwbench's columns, `-n` counts
/// honoured, `-T` sizing all three loops, bad arguments refused.
#[test]
fn p2p_program_is_right_and_time_sized() {
    let Some(exe) = build_named("mpi_p2p") else {
        return;
    };
    let text = mpirun(&exe, 2, &SIZES);
    let got = rows(&text);
    assert_eq!(got.len(), 3, "{text}");
    for (row, size) in got.iter().zip(["8", "1000", "65536"]) {
        assert_eq!(field(row, "coll"), "p2p");
        assert_eq!(field(row, "size"), size, "{row:?}");
        assert_eq!(field(row, "wrong"), "0", "{row:?}");
        assert_eq!(field(row, "iters"), "3,3,3", "{row:?}");
        for k in ["lat_us", "bw", "bibw"] {
            let x: f64 = field(row, k).parse().expect(k);
            assert!(x > 0.0 && x.is_finite(), "{k}: {row:?}");
        }
    }
    let t0 = Instant::now();
    let text = mpirun(&exe, 2, &["-T", "0.1", "4096:1:1"]);
    let got = rows(&text);
    assert_eq!(got.len(), 1, "{text}");
    assert!(t0.elapsed() >= Duration::from_millis(300), "{text}");
    let iters: Vec<u64> = field(&got[0], "iters")
        .split(',')
        .map(|x| x.parse().expect("iters"))
        .collect();
    assert!(iters.len() == 3 && iters.iter().all(|&k| k > 1), "{text}");
    for (ranks, args) in [
        (3u32, &["8:1:1"][..]),
        (2, &["8:0:1"][..]),
        (2, &["-T", "0", "8:1:1"][..]),
    ] {
        let out = Command::new("mpirun.openmpi")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-n",
                &ranks.to_string(),
            ])
            .arg(&exe)
            .args(args)
            .output()
            .expect("run mpirun.openmpi");
        assert!(!out.status.success(), "{ranks} ranks {args:?} was accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("mpi_p2p: "),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
