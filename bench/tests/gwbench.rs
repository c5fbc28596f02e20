//! gwbench end to end: real rank processes started by gwrun.
//!
//! gwrun is another package's binary, so `cargo test -p gw-bench` does not
//! build it: run `cargo build --workspace --bins` (or `cargo build -p
//! gw-jobserver --bin gwrun`) first. The collective tests need the collective
//! algorithms; the p2p and usage tests need only point-to-point transfers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(180);

/// The exact column header nccl-tests prints.
const COLUMNS: [&str; 3] = [
    "#                                                              out-of-place                       in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
];

fn gwbench() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gwbench"))
}

fn gwrun() -> PathBuf {
    let bench = gwbench();
    let dir = bench.parent().expect("gwbench has a directory");
    let gwrun = dir.join("gwrun");
    assert!(
        gwrun.is_file(),
        "{} does not exist: gwrun is built by another package; run `cargo build --workspace --bins` \
         (with the same CARGO_TARGET_DIR and profile) before `cargo test -p gw-bench`",
        gwrun.display()
    );
    gwrun
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn all(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Rank 0's lines, without gwrun's "[0] " tag.
    fn rank0(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("[0] "))
            .collect()
    }
}

/// Runs `program args` with a deadline, killing it when the deadline passes.
fn run(program: &Path, args: &[&str]) -> Run {
    run_with(program, args, &[])
}

/// [`run`] with more environment variables.
fn run_with(program: &Path, args: &[&str], env: &[(&str, &Path)]) -> Run {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .env("GW_TIMEOUT", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let r = Run {
        code: status.and_then(|s| s.code()),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    };
    assert!(
        status.is_some(),
        "{} {args:?} ran past {DEADLINE:?}\n{}",
        program.display(),
        r.all()
    );
    r
}

fn bench(n: u32, args: &[&str]) -> Run {
    let n = n.to_string();
    let bench = gwbench();
    let mut all = vec!["-n", &n, bench.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&gwrun(), &all)
}

/// Checks the table of a collective run and returns its rows, split into fields.
fn table(r: &Run) -> Vec<Vec<String>> {
    assert!(
        !r.stdout.lines().any(|l| !l.starts_with("[0] ")),
        "only rank 0 prints:\n{}",
        r.all()
    );
    let lines = r.rank0();
    let col = lines
        .iter()
        .position(|l| *l == COLUMNS[0])
        .unwrap_or_else(|| panic!("no column header\n{}", r.all()));
    assert_eq!(&lines[col..col + 3], COLUMNS, "{}", r.all());
    for want in [
        "# Transport: ",
        "# Algorithm: ",
        "# Using ranks",
        "#  Rank  0 on ",
        "#  Rank  1 on ",
    ] {
        assert!(
            lines[..col].iter().any(|l| l.starts_with(want)),
            "header lacks {want:?}\n{}",
            r.all()
        );
    }
    let rows: Vec<&str> = lines[col + 3..]
        .iter()
        .copied()
        .take_while(|l| !l.starts_with('#'))
        .collect();
    let mut out = Vec::new();
    for row in &rows {
        assert_eq!(row.len(), COLUMNS[1].len(), "row width: {row:?}");
        let f: Vec<String> = row.split_whitespace().map(String::from).collect();
        assert_eq!(f.len(), 13, "{row:?}");
        for i in [5, 6, 7, 9, 10, 11] {
            let x: f64 = f[i]
                .parse()
                .unwrap_or_else(|_| panic!("field {i} of {row:?}"));
            assert!(x >= 0.0, "{row:?}");
        }
        out.push(f);
    }
    let footer = &lines[col + 3 + rows.len()..];
    assert!(
        footer
            .iter()
            .any(|l| l.starts_with("# Avg bus bandwidth    : ")),
        "{}",
        r.all()
    );
    out
}

#[test]
fn allreduce_two_ranks_rows_and_no_wrong_elements() {
    let r = bench(
        2,
        &[
            "allreduce",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "-c",
            "1",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.all());
    let sizes = [8, 64, 512, 4096, 32768];
    let rows = table(&r);
    assert_eq!(rows.len(), sizes.len(), "{}", r.all());
    for (f, size) in rows.iter().zip(sizes) {
        assert_eq!(f[0], size.to_string(), "{f:?}");
        assert_eq!(f[1], (size / 4).to_string(), "{f:?}");
        assert_eq!(&f[2..5], ["float", "sum", "-1"], "{f:?}");
        assert_eq!(f[8], "0", "out-of-place #wrong: {f:?}");
        assert_eq!(f[12], "0", "in-place #wrong: {f:?}");
        // 2 ranks: busbw = algbw · 2(n-1)/n = algbw.
        assert_eq!(f[6], f[7], "{f:?}");
    }
    assert!(
        r.rank0().contains(&"# Out of bounds values : 0 OK"),
        "{}",
        r.all()
    );
    assert!(r.stdout.contains("nRanks 2"), "{}", r.all());
}

/// Four sizes (4 B to 1 MiB), three timed calls each, every result checked.
const CHECKED_ROWS: [&str; 12] = [
    "-b", "4", "-e", "1M", "-f", "32", "-n", "3", "-w", "1", "-c", "1",
];

/// A run of `CHECKED_ROWS` exited 0 with four rows and no wrong element.
fn all_rows_right(r: &Run, what: &str) {
    assert_eq!(r.code, Some(0), "{what}: {}", r.all());
    let rows = table(r);
    assert_eq!(rows.len(), 4, "{what}: {}", r.all());
    for f in &rows {
        assert_eq!((f[8].as_str(), f[12].as_str()), ("0", "0"), "{what}: {f:?}");
    }
}

/// `-P 1`: the same rows from a persistent all-reduce, checked exactly,
/// for every algorithm that runs on three ranks.
#[test]
fn persistent_allreduce_checks_out_with_every_algorithm() {
    for algo in ["auto", "ring", "tree", "rd"] {
        let mut args = vec!["allreduce"];
        args.extend(CHECKED_ROWS);
        args.extend(["-P", "1", "-a", algo]);
        all_rows_right(&bench(3, &args), &format!("-a {algo}"));
    }
}

/// `--register 1`: buffers registered once with the communicator; over
/// libfabric (which lends them) every collective's rows check out exactly.
#[test]
fn registered_buffers_check_out_over_ofi() {
    let bench = gwbench();
    for coll in ["allreduce", "allgather", "reducescatter", "broadcast"] {
        let mut args = vec![
            "--transport",
            "ofi",
            "-n",
            "2",
            bench.to_str().unwrap(),
            coll,
        ];
        args.extend(CHECKED_ROWS);
        args.extend(["--register", "1"]);
        all_rows_right(&run(&gwrun(), &args), coll);
    }
}

#[test]
fn every_collective_and_algorithm_checks_out_on_three_ranks() {
    let cases: &[&[&str]] = &[
        &["allreduce", "-a", "ring", "-d", "half", "-o", "max"],
        &["allreduce", "-a", "tree", "-d", "int64", "-o", "prod"],
        &["allreduce", "-d", "bfloat16", "-o", "avg"],
        &["reduce_scatter", "-d", "uint8", "-o", "sum"],
        &["allgather", "-d", "double"],
        &["broadcast", "-r", "2", "-d", "int32"],
        &["reduce", "-r", "1", "-o", "min"],
    ];
    for case in cases {
        let mut args = case.to_vec();
        args.extend_from_slice(&[
            "-b", "64", "-e", "256K", "-f", "64", "-n", "2", "-w", "1", "-J",
        ]);
        let json = std::env::temp_dir().join(format!(
            "gwbench-test-{}-{}.json",
            std::process::id(),
            case[0]
        ));
        args.push(json.to_str().unwrap());
        let r = bench(3, &args);
        assert_eq!(r.code, Some(0), "{case:?}\n{}", r.all());
        let rows = table(&r);
        assert_eq!(rows.len(), 3, "{case:?}\n{}", r.all());
        for f in &rows {
            assert_eq!(
                (f[8].as_str(), f[12].as_str()),
                ("0", "0"),
                "{case:?}: {f:?}"
            );
        }
        let lines = r.rank0();
        assert!(
            lines.contains(&"# Out of bounds values : 0 OK"),
            "{case:?}\n{}",
            r.all()
        );
        let j = std::fs::read_to_string(&json).unwrap();
        let _ = std::fs::remove_file(&json);
        assert_eq!(j.matches("\"out_of_place\": {").count(), 3, "{case:?}\n{j}");
        assert!(j.contains("\"world_size\": 3"), "{j}");
        assert!(!j.contains("\"wrong\": 1"), "{j}");
        let v: serde_json::Value = serde_json::from_str(&j).expect("-J writes valid JSON");
        assert_eq!(v["rows"].as_array().map(Vec::len), Some(3), "{j}");
        assert_eq!(v["ok"], true, "{j}");
    }
}

/// `-T`: each timed loop sized by time. Four sizes x two placements of
/// about 0.1 s each take most of 0.8 s (a loop sized from a slower
/// sizing batch may run short, so the bound is half that), while `-n 1`
/// alone would take milliseconds; the header and the JSON say so, and
/// every result is still checked.
#[test]
fn time_sized_loops() {
    let json = std::env::temp_dir().join(format!("gwbench-test-{}-time.json", std::process::id()));
    let t0 = std::time::Instant::now();
    let r = bench(
        2,
        &[
            "allreduce",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "1",
            "-w",
            "1",
            "-T",
            "0.1",
            "-J",
            json.to_str().unwrap(),
        ],
    );
    let took = t0.elapsed();
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(took >= Duration::from_millis(400), "{took:?}\n{}", r.all());
    let rows = table(&r);
    assert_eq!(rows.len(), 4, "{}", r.all());
    for f in &rows {
        assert_eq!((f[8].as_str(), f[12].as_str()), ("0", "0"), "{f:?}");
    }
    assert!(
        r.rank0()[0].ends_with("iters: 1 validation: 1 timed loops: about 0.1 s each"),
        "{}",
        r.all()
    );
    let j = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&j).expect("-J writes valid JSON");
    assert_eq!(v["header"]["time_s"], 0.1, "{j}");
}

#[test]
fn algorithm_that_cannot_run_is_one_line_exit_1() {
    let r = bench(3, &["allreduce", "-a", "rhd", "-b", "8", "-e", "8"]);
    assert_eq!(r.code, Some(1), "{}", r.all());
    let errors = error_lines(&r);
    assert_eq!(errors.len(), 1, "{}", r.all());
    assert!(
        errors[0].contains("rhd") && errors[0].contains("power-of-two"),
        "{}",
        r.all()
    );
}

/// The lines of stderr that report a gwbench error.
fn error_lines(r: &Run) -> Vec<&str> {
    r.stderr
        .lines()
        .filter(|l| l.contains("gwbench: error:"))
        .collect()
}

/// Whether an error line names the missing CUDA driver and the loader's reason.
fn names_the_missing_driver(line: &str) -> bool {
    line.contains("--device cuda: CUDA driver not found (libcuda.so.1: ")
}

/// A run that failed (exit 1) without a panic.
fn failed_without_panic(r: &Run) {
    assert_eq!(r.code, Some(1), "{}", r.all());
    assert!(!r.all().contains("panicked"), "{}", r.all());
}

/// Rank 0's rows after perftest's column line starting with `first`.
fn perftest_rows(r: &Run, first: &str, width: usize) -> Vec<Vec<f64>> {
    let lines = r.rank0();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no perftest columns\n{}", r.all()));
    lines[at + 1..]
        .iter()
        .take_while(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<f64> = l
                .split_whitespace()
                .map(|x| x.parse().unwrap_or_else(|_| panic!("{l:?}")))
                .collect();
            assert_eq!(f.len(), width, "{l:?}");
            f
        })
        .collect()
}

#[test]
fn p2p_in_perftests_shape() {
    let bw = bench(
        2,
        &[
            "p2p", "--op", "send", "-b", "8", "-e", "64K", "-f", "64", "-n", "40", "-w", "2",
        ],
    );
    assert_eq!(bw.code, Some(0), "{}", bw.all());
    assert!(
        bw.stdout.contains(
            "#bytes     #iterations   BW peak[GB/sec]    BW average[GB/sec]    MsgRate[Mpps]"
        ),
        "{}",
        bw.all()
    );
    let rows = perftest_rows(&bw, "#bytes", 5);
    assert_eq!(
        rows.iter().map(|f| f[0]).collect::<Vec<_>>(),
        [8.0, 512.0, 32768.0]
    );
    for f in &rows {
        assert_eq!(f[1], 40.0);
        // Two decimals of GB/s: 8-byte rows print 0.00, as perftest's do.
        assert!(f[2] >= f[3] && f[4] > 0.0, "peak >= average, a rate: {f:?}");
        assert!(f[0] < 32768.0 || f[3] > 0.0, "{f:?}");
    }
    let bi = bench(
        2,
        &[
            "p2p", "-o", "send", "--bidir", "-b", "1M", "-e", "1M", "-n", "16",
        ],
    );
    assert_eq!(bi.code, Some(0), "{}", bi.all());
    assert_eq!(perftest_rows(&bi, "#bytes", 5).len(), 1);
    let lat = bench(
        2,
        &[
            "p2p", "--op", "send", "--lat", "-b", "8", "-e", "4K", "-f", "8", "-n", "200",
        ],
    );
    assert_eq!(lat.code, Some(0), "{}", lat.all());
    assert!(
        lat.stdout.contains("t_typical[usec]") && lat.stdout.contains("99.9% percentile[usec]")
    );
    let rows = perftest_rows(&lat, "#bytes", 9);
    assert_eq!(rows.len(), 4, "{}", lat.all());
    for f in &rows {
        let (min, max, typ, avg, p99, p999) = (f[2], f[3], f[4], f[5], f[7], f[8]);
        assert!(
            min > 0.0 && min <= typ && typ <= max && min <= avg && avg <= max,
            "{f:?}"
        );
        assert!(p99 <= p999 && p999 <= max, "{f:?}");
    }
}

/// `--op write --lat` and `--op read --lat`: ib_write_lat's rows from a
/// ping-pong of one-sided writes, ib_read_lat's from rank 1's reads of rank
/// 0's buffer timed one at a time; every landing checked (`-c 1`).
#[test]
fn p2p_one_sided_latency_in_perftests_shape() {
    for op in ["write", "read"] {
        let r = bench(
            2,
            &[
                "p2p", "--op", op, "--lat", "-b", "8", "-e", "4K", "-f", "8", "-n", "200", "-c",
                "1",
            ],
        );
        assert_eq!(r.code, Some(0), "{op}: {}", r.all());
        assert!(r.stdout.contains("t_typical[usec]"), "{}", r.all());
        let rows = perftest_rows(&r, "#bytes", 9);
        assert_eq!(
            rows.iter().map(|f| f[0]).collect::<Vec<_>>(),
            [8.0, 64.0, 512.0, 4096.0],
            "{}",
            r.all()
        );
        for f in &rows {
            let (min, max, typ, avg, p99, p999) = (f[2], f[3], f[4], f[5], f[7], f[8]);
            assert_eq!(f[1], 200.0, "{op}: {f:?}");
            assert!(
                min > 0.0 && min <= typ && typ <= max && min <= avg && avg <= max,
                "{op}: {f:?}"
            );
            assert!(p99 <= p999 && p999 <= max, "{op}: {f:?}");
        }
    }
}

/// `--op write` and `--op read`: one-sided writes (persistent puts) and
/// reads (persistent gets: rank 1 reads rank 0's buffer) in ib_write_bw's
/// and ib_read_bw's columns, every message checked where it landed (`-c
/// 1`), one way and both ways, over shared memory, libfabric's tcp
/// provider and gradwire's TCP (reads answered by the owner's progress).
#[test]
fn p2p_one_sided_in_perftests_shape() {
    let bench = gwbench();
    for (op, transport, bidir) in [
        ("write", "shm", false),
        ("write", "shm", true),
        ("read", "shm", false),
        ("read", "shm", true),
        ("read", "ofi", false),
        ("read", "tcp", true),
    ] {
        let mut args = vec![
            "--transport",
            transport,
            "-n",
            "2",
            bench.to_str().unwrap(),
            "p2p",
            "--op",
            op,
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "128",
            "-n",
            "16",
            "-c",
            "1",
        ];
        if bidir {
            args.push("--bidir");
        }
        let r = run(&gwrun(), &args);
        assert_eq!(r.code, Some(0), "{op} {transport} {bidir}: {}", r.all());
        let rows = perftest_rows(&r, "#bytes", 5);
        assert_eq!(
            rows.iter().map(|f| f[0]).collect::<Vec<_>>(),
            [8.0, 1024.0, 131072.0],
            "{}",
            r.all()
        );
        for f in &rows {
            assert_eq!(f[1], 16.0, "{f:?}");
            assert!(f[2] >= f[3] && f[4] > 0.0, "peak >= average, a rate: {f:?}");
        }
        assert!(rows[2][3] > 0.0, "{}", r.all());
    }
}

/// `--hugepages 1`: the buffers advised onto huge pages still carry every
/// byte right, and the header says what the kernel gave.
#[test]
fn buffers_on_huge_pages_check_out_and_say_so() {
    let program = gwbench();
    let b = program.to_str().unwrap();
    let coll = run(
        &gwrun(),
        &[
            "--transport",
            "shm",
            "-n",
            "2",
            b,
            "allreduce",
            "-b",
            "8",
            "-e",
            "8M",
            "-f",
            "64",
            "-n",
            "2",
            "--hugepages",
            "1",
        ],
    );
    all_rows_right(&coll, "allreduce --hugepages 1");
    let write = run(
        &gwrun(),
        &[
            "--transport",
            "shm",
            "-n",
            "2",
            b,
            "p2p",
            "--op",
            "write",
            "-b",
            "1M",
            "-e",
            "4M",
            "-f",
            "4",
            "-n",
            "4",
            "-c",
            "1",
            "--hugepages",
            "1",
        ],
    );
    assert_eq!(write.code, Some(0), "{}", write.all());
    assert_eq!(
        perftest_rows(&write, "#bytes", 5).len(),
        2,
        "{}",
        write.all()
    );
    for r in [&coll, &write] {
        let line = r
            .rank0()
            .into_iter()
            .find(|l| l.starts_with("# Buffers: transparent huge pages asked for; "))
            .unwrap_or_else(|| panic!("no huge page line\n{}", r.all()));
        assert!(line.contains(" MiB on them (rank 0; kernel: "), "{line}");
    }
    let plain = bench(2, &["allreduce", "-b", "8", "-e", "8", "-n", "1"]);
    assert!(!plain.stdout.contains("# Buffers:"), "{}", plain.all());
}

#[test]
fn perftest_flags_refused_where_they_do_not_apply() {
    for (args, want) in [
        (
            &["p2p", "--op", "write", "--lat", "--bidir"][..],
            "--lat takes no --bidir",
        ),
        (
            &["p2p", "--op", "read", "--lat", "--bidir"],
            "--lat takes no --bidir",
        ),
        (&["p2p", "--lat"], "go with --op"),
        (
            &["p2p", "--op", "send", "--lat", "--bidir"],
            "--lat takes no --bidir",
        ),
        (&["allreduce", "--bidir"], "applies to p2p only"),
        (&["allreduce", "-o", "send"], "is a p2p operation"),
        (
            &["allreduce", "--hugepages", "1", "--device", "cuda"],
            "--hugepages 1 applies to host buffers",
        ),
        (&["p2p", "--hugepages", "2"], "--hugepages"),
        (
            &["p2p", "--hugepages", "1", "--device", "cuda"],
            "--hugepages 1 applies to host buffers",
        ),
    ] {
        let r = run(&gwbench(), args);
        assert_eq!(r.code, Some(2), "{args:?}\n{}", r.all());
        assert!(r.stderr.contains(want), "{args:?}: {}", r.all());
    }
}

#[test]
fn p2p_two_ranks() {
    let json = std::env::temp_dir().join(format!("gwbench-test-{}-p2p.json", std::process::id()));
    let r = bench(
        2,
        &[
            "p2p",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
            "-J",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        !r.stdout.lines().any(|l| !l.starts_with("[0] ")),
        "only rank 0 prints:\n{}",
        r.all()
    );
    let lines = r.rank0();
    assert!(
        lines.iter().any(|l| l.starts_with("# Transport: ")),
        "{}",
        r.all()
    );
    let header = lines
        .iter()
        .position(|l| l.contains("latency") && l.contains("#wrong"))
        .unwrap_or_else(|| panic!("no column header\n{}", r.all()));
    let rows: Vec<&str> = lines[header + 2..]
        .iter()
        .copied()
        .take_while(|l| !l.starts_with('#'))
        .collect();
    let sizes = [8, 64, 512, 4096, 32768];
    assert_eq!(rows.len(), sizes.len(), "{}", r.all());
    for (row, size) in rows.iter().zip(sizes) {
        assert_eq!(row.len(), lines[header].len(), "row width: {row:?}");
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{row:?}");
        assert_eq!(f[0], size.to_string());
        for x in &f[1..4] {
            let v: f64 = x.parse().unwrap_or_else(|_| panic!("{row:?}"));
            assert!(v >= 0.0, "{row:?}");
        }
        let latency: f64 = f[1].parse().unwrap();
        assert!(latency > 0.0, "{row:?}");
        assert_eq!(f[4], "0", "#wrong: {row:?}");
    }
    assert!(
        lines.contains(&"# Out of bounds values : 0 OK"),
        "{}",
        r.all()
    );
    let j = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(j.matches("\"latency_us\":").count(), 5, "{j}");
    assert!(j.contains("\"collective\": \"p2p\""), "{j}");
    let v: serde_json::Value = serde_json::from_str(&j).expect("-J writes valid JSON");
    assert_eq!(v["rows"][4]["size"], 32768, "{j}");
}

/// `p2p -T`: each of a row's three loops is sized to about the target, so
/// two sizes take most of 6 × 0.1 s (a loop sized from a slower sizing
/// batch may run short, so the bound is half that, as for the
/// collectives' `-T` test); the header says so; `-J` keeps it.
#[test]
fn p2p_time_sized_loops() {
    let json = std::env::temp_dir().join(format!("gwbench-test-{}-p2pT.json", std::process::id()));
    let t0 = std::time::Instant::now();
    let r = bench(
        2,
        &[
            "p2p",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "64",
            "-n",
            "1",
            "-w",
            "1",
            "-T",
            "0.1",
            "-J",
            json.to_str().unwrap(),
        ],
    );
    let took = t0.elapsed();
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(took >= Duration::from_millis(300), "{took:?}\n{}", r.all());
    assert!(
        r.rank0()
            .iter()
            .any(|l| l.ends_with("timed loops: about 0.1 s each")),
        "{}",
        r.all()
    );
    let j = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&j).expect("-J writes valid JSON");
    assert_eq!(v["header"]["time_s"], 0.1, "{j}");
    assert_eq!(v["ok"], true, "{j}");
    for (row, size) in v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .zip([1024, 65536])
    {
        assert_eq!(row["size"], size, "{j}");
        assert_eq!(row["wrong"], 0, "{j}");
        for k in ["latency_us", "bw", "bibw"] {
            assert!(row[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {j}");
        }
    }
}

#[test]
fn p2p_refuses_other_world_sizes() {
    let r = bench(3, &["p2p", "-e", "8"]);
    assert_eq!(r.code, Some(2), "{}", r.all());
    let errors = error_lines(&r);
    assert_eq!(errors.len(), 1, "{}", r.all());
    assert!(errors[0].contains("exactly 2 ranks"), "{}", r.all());
}

#[test]
fn usage_errors_and_help_without_a_launcher() {
    for args in [
        &["allreduce", "-x"][..],
        &["allreduce", "-b", "1Q"],
        &["alltoall"],
        &[],
        &["allreduce", "-o", "avg", "-d", "int32"],
        &["broadcast", "-P", "1"],
        &["p2p", "-P", "1"],
        &["allreduce", "-P", "2"],
        &["p2p", "--register", "1"],
        &["allreduce", "--register", "1", "--device", "cuda"],
    ] {
        let r = run(&gwbench(), args);
        assert_eq!(r.code, Some(2), "{args:?}\n{}", r.all());
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}\n{}", r.all());
        assert!(
            r.stderr.starts_with("gwbench: error: "),
            "{args:?}\n{}",
            r.all()
        );
        assert!(r.stdout.is_empty());
    }
    let h = run(&gwbench(), &["--help"]);
    assert_eq!(h.code, Some(0));
    for flag in [
        "-b", "-e", "-f", "-n", "-w", "-c", "-d", "-o", "-r", "-a", "-J", "-P", "-T", "p2p",
    ] {
        assert!(h.stdout.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn under_gwrun_usage_errors_and_help_are_printed_once() {
    let r = bench(3, &["allreduce", "-x", "1"]);
    assert_eq!(r.code, Some(2), "{}", r.all());
    let errors = r
        .stdout
        .lines()
        .chain(r.stderr.lines())
        .filter(|l| l.contains("gwbench: error:"))
        .count();
    assert_eq!(errors, 1, "{}", r.all());

    let h = bench(2, &["--help"]);
    assert_eq!(h.code, Some(0), "{}", h.all());
    let usage: Vec<&str> = h.stdout.lines().filter(|l| l.contains("Usage:")).collect();
    assert_eq!(usage.len(), 1, "{}", h.all());
    assert!(usage[0].starts_with("[0] "), "{}", h.all());
}

#[test]
fn completions_and_subcommand_help_without_a_launcher() {
    for (shell, want) in [
        ("bash", "_gwbench"),
        ("zsh", "#compdef gwbench"),
        ("fish", "gwbench"),
    ] {
        let r = run(&gwbench(), &["completions", shell]);
        assert_eq!(r.code, Some(0), "{shell}\n{}", r.all());
        assert!(r.stdout.contains(want), "{shell}\n{}", r.all());
        assert!(r.stdout.contains("maxbytes"), "{shell}\n{}", r.all());
    }
    let r = run(&gwbench(), &["completions", "tcsh"]);
    assert_eq!(r.code, Some(2), "{}", r.all());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.all());
    let h = run(&gwbench(), &["calibrate", "--help"]);
    assert_eq!(h.code, Some(0), "{}", h.all());
    assert!(h.stdout.contains("GW_MODEL_FILE"), "{}", h.all());
    let top = run(&gwbench(), &["--help"]);
    assert!(top.stdout.contains("completions"), "{}", top.all());
}

/// `gwbench calibrate` on 2 ranks writes a model file that the library
/// reads back: α and β of both transports, β measured at each of the
/// curve's six sizes in order, and γ; on 3 ranks it refuses, naming the
/// count, and writes nothing.
#[test]
fn calibrate_writes_a_model_the_library_reads_back() {
    let dir = std::env::temp_dir().join(format!("gw-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model");
    let bench = gwbench();
    let args = |n| vec!["-n", n, bench.to_str().unwrap(), "calibrate"];
    let r = run_with(&gwrun(), &args("3"), &[("GW_MODEL_FILE", &path)]);
    assert_ne!(r.code, Some(0), "{}", r.all());
    assert!(
        r.all().contains("run it on exactly 2 ranks, not 3"),
        "{}",
        r.all()
    );
    assert!(!path.exists(), "3 ranks wrote {}", path.display());

    let r = run_with(&gwrun(), &args("2"), &[("GW_MODEL_FILE", &path)]);
    assert_eq!(r.code, Some(0), "{}", r.all());
    assert!(
        r.rank0()
            .iter()
            .any(|l| l.contains(&format!("written to {}", path.display()))),
        "{}",
        r.all()
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let m =
        gw_collectives::model::CostModel::decode(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];
    for (name, link, curve) in [("tcp", m.tcp, m.tcp_curve), ("shm", m.shm, m.shm_curve)] {
        // A call costs more than nothing and less than a timeout.
        assert!(link.alpha > 0.0 && link.alpha < 0.1, "{name}: {text}");
        assert!(link.beta > 0.0 && link.beta.is_finite(), "{name}: {text}");
        let pts = curve.points();
        assert_eq!(
            pts.iter().map(|p| p.0).collect::<Vec<_>>(),
            sizes,
            "{name}: {text}"
        );
        assert!(
            pts.iter().all(|p| p.1 > 0.0 && p.1.is_finite()),
            "{name}: {text}"
        );
    }
    assert!(m.gamma > 0.0 && m.gamma.is_finite(), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GW_TRACE`: both ranks append to one Chrome trace that a JSON reader
/// accepts once the optional `]` is added, with every collective and,
/// inside each, its sends and receives to the other rank.
#[test]
fn trace_file_holds_every_ranks_collectives_and_transfers() {
    let dir = std::env::temp_dir().join(format!("gw-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.json");
    std::fs::write(&path, "left over from an earlier run").unwrap();
    let var = format!("GW_TRACE={}", path.display());
    let bench = gwbench();
    let r = run(
        &gwrun(),
        &[
            "-n",
            "2",
            "env",
            &var,
            bench.to_str().unwrap(),
            "allreduce",
            "-b",
            "64K",
            "-e",
            "256K",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "1",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.all());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("[\n"), "{}", &text[..text.len().min(200)]);
    let json = format!("{}]", text.trim_end().trim_end_matches(','));
    let v: serde_json::Value = serde_json::from_str(&json).expect("the trace is JSON");
    let events = v.as_array().unwrap();
    for rank in 0..2u64 {
        let mine = |name: &str| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == rank && e["name"] == name)
                .collect()
        };
        let colls = mine("all_reduce");
        // 2 sizes x 2 placements x (3 timed + 1 warm-up) at least.
        assert!(
            colls.len() >= 16,
            "rank {rank}: {} all-reduces",
            colls.len()
        );
        let (sends, recvs) = (mine("send"), mine("recv"));
        assert!(!sends.is_empty() && !recvs.is_empty(), "rank {rank}");
        // Every operation, barriers included, on the collectives lane.
        let ops: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == rank && e["tid"] == 0)
            .collect();
        for t in sends.iter().chain(&recvs) {
            assert_eq!(t["args"]["peer"], 1 - rank, "{t}");
            // Inside the operation of its sequence number.
            let (ts, dur) = (t["ts"].as_f64().unwrap(), t["dur"].as_f64().unwrap());
            let c = ops
                .iter()
                .find(|c| c["args"]["seq"] == t["args"]["seq"])
                .unwrap_or_else(|| panic!("no operation for {t}"));
            if c["name"] == "all_reduce" {
                assert!(t["args"]["bytes"].as_u64().unwrap() > 0, "{t}");
            }
            let (cs, cd) = (c["ts"].as_f64().unwrap(), c["dur"].as_f64().unwrap());
            assert!(
                ts >= cs - 1.0 && ts + dur <= cs + cd + 1.0,
                "{t} outside {c}"
            );
        }
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "M" && e["pid"] == rank && e["args"]["name"] == "transfers"),
            "rank {rank} names its lanes"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--device cuda` runs the collectives and p2p's own table on device
/// buffers through the C ABI's device paths (the GPU check runs them on a
/// GPU). Where there is no NVIDIA driver each fails in one line naming the
/// loader's reason, never a panic; p2p's perftest tables refuse it by name.
#[test]
fn device_cuda_without_a_driver_is_one_line_naming_it() {
    // SAFETY: probing for the driver runs only its initialisers.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_ok() {
        println!("skipped: this machine has a CUDA driver (the GPU check covers it)");
        return;
    }
    // One rank: with more, gwrun stops the others once the first exits,
    // which may cut their lines short.
    let r = bench(1, &["allreduce", "--device", "cuda", "-b", "8", "-e", "1K"]);
    let errors = error_lines(&r);
    assert_eq!(errors.len(), 1, "one line: {}", r.all());
    assert!(names_the_missing_driver(errors[0]), "{}", r.all());
    failed_without_panic(&r);
    // p2p needs its two ranks; the second may be stopped once the first has
    // exited, even halfway through its line, so one line names it.
    let r = bench(2, &["p2p", "--device", "cuda", "-b", "8", "-e", "1K"]);
    assert!(
        error_lines(&r).into_iter().any(names_the_missing_driver),
        "{}",
        r.all()
    );
    failed_without_panic(&r);
    for op in ["send", "write", "read"] {
        let r = bench(2, &["p2p", "--op", op, "--device", "cuda"]);
        assert_eq!(r.code, Some(2), "{}", r.all());
        assert!(
            r.all()
                .contains("--device cuda goes with gwbench's own p2p table, not with --op"),
            "{}",
            r.all()
        );
    }
}
