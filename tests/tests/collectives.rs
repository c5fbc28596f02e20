//! Collectives end to end (Gloo's test matrix): every collective × transport ×
//! world size × count × dtype × operator × placement, checked exactly against
//! a sequential reference, one launched job per (transport, world size); then
//! non-blocking operations, a random stress run, refused calls and ranks that
//! disagree about the operation.

use gw_tests::{DirectJob, gwrun};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(600);
const COUNTS: [&str; 5] = ["0", "1", "7", "1000", "1048589"];

fn run_ok(n: u32, env: &[(&str, &str)], args: &[&str], want: &str) -> String {
    let run = gwrun(n, "gwtest", args, env, DEADLINE);
    assert!(
        run.status.success(),
        "n={n} {env:?} {args:?}: {}",
        run.all()
    );
    for r in 0..n {
        let line = format!("[{r}] rank {r}: {want}");
        assert!(
            run.stdout.contains(&line),
            "missing {line:?}: {}",
            run.all()
        );
    }
    run.stdout
}

fn matrix(transport: &str, n: u32) {
    matrix_with(transport, n, &[]);
}

fn matrix_with(transport: &str, n: u32, more_env: &[(&str, &str)]) {
    let mut args = vec!["collectives"];
    // On 5 and 8 ranks (oversubscribed 2.5-4x on CI's 2 cores) the 1 Mi-element
    // cases run for two representative dtypes; smaller counts cover all seven.
    if n > 4 {
        args.extend(["--big-only", "float,bfloat16"]);
    }
    args.extend(COUNTS);
    let mut env = vec![("GW_TRANSPORT", transport)];
    env.extend_from_slice(more_env);
    let out = run_ok(n, &env, &args, "collectives ok");
    if n > 1 {
        assert!(out.contains(&format!("transports {transport}")), "{out}");
    }
}

#[test]
fn matrix_tcp_1_2_3() {
    for n in [1, 2, 3] {
        matrix("tcp", n);
    }
}

#[test]
fn matrix_tcp_4_5_8() {
    for n in [4, 5, 8] {
        matrix("tcp", n);
    }
}

#[test]
fn matrix_shm_1_2_3() {
    for n in [1, 2, 3] {
        matrix("shm", n);
    }
}

#[test]
fn matrix_shm_4_5_8() {
    for n in [4, 5, 8] {
        matrix("shm", n);
    }
}

/// The libfabric transport over its two providers that need no hardware
/// (scripts/test.sh installs libfabric).
#[test]
fn matrix_ofi_tcp_provider_1_2_3_4_8() {
    for n in [1, 2, 3, 4, 8] {
        matrix_with("ofi", n, &[("GW_OFI_PROVIDER", "tcp;ofi_rxm")]);
    }
}

#[test]
fn matrix_ofi_shm_provider_2_3_4() {
    for n in [2, 3, 4] {
        matrix_with("ofi", n, &[("GW_OFI_PROVIDER", "shm")]);
    }
}

#[test]
fn every_forced_all_reduce_algorithm_over_ofi() {
    for (algo, n) in [("ring", 3), ("tree", 5), ("rhd", 4), ("rd", 3), ("hier", 4)] {
        run_ok(
            n,
            &[
                ("GW_TRANSPORT", "ofi"),
                ("GW_OFI_PROVIDER", "tcp;ofi_rxm"),
                ("GW_ALGO", algo),
            ],
            &["collectives", "0", "1", "7", "1000", "70000"],
            "collectives ok",
        );
    }
}

#[test]
fn every_forced_all_reduce_algorithm() {
    for (algo, n) in [
        ("ring", 3),
        ("tree", 3),
        ("tree", 5),
        ("rhd", 4),
        // Recursive doubling with a fold (3 = 2 + 1) and without.
        ("rd", 3),
        ("rd", 4),
        ("ring", 8),
        // One host: hier's intra-host phases only (netns.rs runs it across hosts).
        ("hier", 4),
    ] {
        for transport in ["tcp", "shm"] {
            run_ok(
                n,
                &[("GW_TRANSPORT", transport), ("GW_ALGO", algo)],
                &["collectives", "0", "1", "7", "1000", "70000"],
                "collectives ok",
            );
        }
    }
}

/// The default pipeline depth depends on cores per rank (1 with a core each,
/// 8 where ranks share cores); whatever it is here, every depth a user can
/// pick must give the same results. Small segments make even the 70000- and
/// 1 Mi-element messages pipeline through many segments per step.
#[test]
fn every_pipeline_depth_gives_the_same_results() {
    for (n, depth) in [(2, "8"), (2, "1"), (3, "1"), (4, "2")] {
        for transport in ["tcp", "shm"] {
            let env = [
                ("GW_TRANSPORT", transport),
                ("GW_PIPELINE_DEPTH", depth),
                ("GW_SEGMENT_BYTES", "4096"),
                ("GW_DEBUG", "info"),
            ];
            let args = ["collectives", "0", "1", "7", "1000", "70000"];
            let run = gwrun(n, "gwtest", &args, &env, DEADLINE);
            assert!(run.status.success(), "n={n} {env:?}: {}", run.all());
            for r in 0..n {
                for want in [
                    format!("rank {r}: pipeline depth {depth} "),
                    format!("[{r}] rank {r}: collectives ok"),
                ] {
                    assert!(run.all().contains(&want), "missing {want:?}: {}", run.all());
                }
            }
        }
    }
    run_ok(
        4,
        &[("GW_PIPELINE_DEPTH", "1"), ("GW_SEGMENT_BYTES", "4096")],
        &["stress", "300"],
        "stress ok: 300 random collectives",
    );
}

/// The first two processors this process may use: the same one twice on a
/// one-processor machine, where ranks bound to "two" really do share it.
fn first_two_cpus() -> [u32; 2] {
    let mine = gw_rendezvous::peers::own_cpus();
    assert!(!mine.is_empty(), "sched_getaffinity named no processor");
    [mine[0], mine[mine.len().min(2) - 1]]
}

/// Ranks that a launcher binds to a processor each (`srun
/// --cpu-bind=cores`, `taskset` per rank) each see one, but share none: they must count the processors
/// of their host, not their own, or they take themselves for ranks sharing
/// one core (shared-memory pulls, yielding spins, deep pipelines, and a cost
/// model that charges them twice).
#[test]
fn ranks_bound_to_a_processor_each_count_their_hosts() {
    let cpus = first_two_cpus();
    let distinct = if cpus[0] == cpus[1] { 1 } else { 2 };
    let gwtest = gw_tests::bin("gwtest");
    let script = format!(
        "case $GW_LOCAL_RANK in 0) c={};; *) c={};; esac; exec taskset -c $c {} collectives 0 1 7 1000",
        cpus[0],
        cpus[1],
        gwtest.display()
    );
    for transport in ["tcp", "shm"] {
        let env = [("GW_TRANSPORT", transport), ("GW_DEBUG", "info")];
        let run = gwrun(2, "sh", &["-c", &script], &env, DEADLINE);
        assert!(run.status.success(), "{transport}: {}", run.all());
        for r in 0..2 {
            for want in [
                format!("rank {r}: pipeline depth "),
                format!("(2 ranks on this host, {distinct} cores)"),
                format!("[{r}] rank {r}: collectives ok"),
            ] {
                assert!(
                    run.all().contains(&want),
                    "{transport}: missing {want:?}: {}",
                    run.all()
                );
            }
        }
    }
}

/// Four ranks bound to two processors share them, two to a core: shared
/// memory then pulls the segments of chain broadcasts and all-gathers of 4
/// MiB and more in one copy (`config::STORED_PULL_BYTES_SHARED_CORES`), such
/// all-gathers and broadcasts fan out (`config::fans_out`), the all-gathers'
/// blocks whole and pulled, the star broadcast's 128 KiB segments through
/// the slots; and so they do four to a core, bound to one processor, where
/// the transport's own threshold holds, and where all-gathers fan out from
/// 2 MiB of output (`config::FAN_OUT_GATHER_CORE_BYTES`: uint8's 2 MiB
/// takes the ring two to a core and fans out four to a core). Results are
/// checked element by element. Bound here, so that the paths run on hosts
/// with more processors too.
#[test]
fn large_stored_collectives_pulled_where_two_ranks_share_a_core() {
    let [a, b] = first_two_cpus();
    let mut launches = vec![(a.to_string(), 262144, true)];
    if a != b {
        launches.insert(0, (format!("{a},{b}"), 65536, false));
    }
    for (cpus, stored_from, crowded) in launches {
        let all = shm_collectives_bound(4, "", &cpus, "1000 524291 1048589", "info,");
        let want = format!("point-to-point and stored messages from {stored_from} bytes");
        assert!(all.contains(&want), "cores {cpus}: missing {want:?}: {all}");
        for r in 0..4 {
            for want in [
                format!("rank {r}: shm: rank {r},"),
                format!("[{r}] rank {r}: collectives ok"),
                format!("rank {r}: fan-out all-gather for all_gather of 1048589 elements"),
                format!("rank {r}: fan-out broadcast for broadcast of 1048589 elements"),
            ] {
                assert!(all.contains(&want), "cores {cpus}: missing {want:?}: {all}");
            }
            // Whole all-gather blocks; the star broadcast's 128 KiB segments
            // (float's; uint8's broadcast, 1 MiB, runs the chain).
            let gather = "fan-out all-gather for all_gather of 1048589 elements";
            let segs = logged_segments(&all, r, gather);
            assert_eq!(segs, [1048589], "cores {cpus}: {all}");
            let bcast = "fan-out broadcast for broadcast of 1048589 elements";
            let segs = logged_segments(&all, r, bcast);
            assert_eq!(segs, [32768], "cores {cpus}: {all}");
            // 524291 elements: float's 8 MiB of output fans out either way;
            // uint8's 2 MiB only four to a core.
            let tag = format!("[{r}] ");
            let gathers: Vec<&str> = all
                .lines()
                .filter(|l| l.starts_with(&tag) && l.contains("all_gather of 524291 elements"))
                .collect();
            let fanned = |l: &&str| l.contains("fan-out all-gather for");
            assert!(gathers.iter().any(fanned), "cores {cpus}: {all}");
            assert_eq!(
                gathers.iter().all(fanned),
                crowded,
                "cores {cpus}: {gathers:?}"
            );
            let fan = "fan-out all-gather for all_gather of 524291 elements";
            assert_eq!(
                logged_segments(&all, r, fan),
                [524291],
                "whole: {gathers:?}"
            );
        }
    }
}

/// Runs `gwtest collectives COUNTS` over shared memory on `n` ranks, the
/// large counts for float and uint8 only, each rank under `taskset -c
/// CPUS` (`cpus` is a shell word, which `prelude` may set), with the
/// schedule cache's debug lines on after `debug` (a `GW_DEBUG` prefix);
/// asserts that it succeeded and returns everything it printed.
fn shm_collectives_bound(n: u32, prelude: &str, cpus: &str, counts: &str, debug: &str) -> String {
    let script = format!(
        "{prelude}exec taskset -c {cpus} {} collectives --big-only float,uint8 {counts}",
        gw_tests::bin("gwtest").display()
    );
    let debug = format!("{debug}gw_collectives::sched_cache=debug");
    let env = [("GW_TRANSPORT", "shm"), ("GW_DEBUG", debug.as_str())];
    let run = gwrun(n, "sh", &["-c", &script], &env, DEADLINE);
    let all = run.all();
    assert!(run.status.success(), "cores {cpus}: {all}");
    all
}

/// The segments (in elements) that rank `r`'s schedule cache logged for
/// schedules whose debug line contains `what`
/// (`GW_DEBUG=gw_collectives::sched_cache=debug`), in the order logged, each
/// once.
fn logged_segments(all: &str, r: u32, what: &str) -> Vec<u64> {
    let mut segs = Vec::new();
    let tag = format!("[{r}] ");
    for line in all
        .lines()
        .filter(|l| l.starts_with(&tag) && l.contains(what))
    {
        let after = line.split("segment_elems ").nth(1).unwrap_or("");
        let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
        let seg = digits
            .parse()
            .unwrap_or_else(|_| panic!("no segment in {line:?}"));
        if !segs.contains(&seg) {
            segs.push(seg);
        }
    }
    segs
}

/// Two ranks with a core each pull a 2-rank all-gather's blocks from 4 MiB
/// of output, and send each block whole rather than in segments
/// (`config::all_gather_whole_blocks`); a smaller all-gather keeps its
/// segments, and so does every all-gather where the two share a core.
/// Results are checked element by element.
#[test]
fn two_ranks_with_a_core_each_send_large_all_gather_blocks_whole() {
    let [a, b] = first_two_cpus();
    // float: 8 MiB of output, one block of 1048589 elements a rank; uint8:
    // 2 MiB, 128 KiB segments. Sharing a core: 128 KiB segments for both.
    let mut launches = vec![(a, [32768, 131072])];
    if a != b {
        launches.push((b, [131072, 1048589]));
    }
    for (second, want) in launches {
        let prelude = format!("case $GW_LOCAL_RANK in 0) c={a};; *) c={second};; esac; ");
        let all = shm_collectives_bound(2, &prelude, "$c", "1048589", "");
        let what = "ring all-gather for all_gather of 1048589 elements on 2 ranks";
        for r in 0..2 {
            let mut segs = logged_segments(&all, r, what);
            segs.sort_unstable();
            assert_eq!(segs, want, "rank {r}, cores {a} and {second}: {all}");
            let ok = format!("[{r}] rank {r}: collectives ok");
            assert!(all.contains(&ok), "missing {ok:?}: {all}");
        }
    }
}

/// Ranks with different `GW_FANOUT` would run different all-gathers and
/// broadcasts: init fails, naming who said what, before anything is sent.
#[test]
fn ranks_that_disagree_on_fan_out_fail_at_init_naming_them() {
    let script = format!(
        "GW_FANOUT=$((GW_RANK % 2)) exec {} collectives 7",
        gw_tests::bin("gwtest").display()
    );
    let run = gwrun(
        3,
        "sh",
        &["-c", &script],
        &[("GW_TRANSPORT", "shm")],
        DEADLINE,
    );
    assert!(!run.status.success(), "{}", run.all());
    let want = "GW_FANOUT differs between ranks: 1 on ranks 1, 0 on ranks 0, 2";
    // The first rank to fail ends the job, so not every rank gets to say it.
    assert!(run.all().contains(want), "missing {want:?}: {}", run.all());
}

#[test]
fn rhd_on_three_ranks_is_refused_clearly() {
    let run = gwrun(
        3,
        "gwtest",
        &["collectives", "8"],
        &[("GW_ALGO", "rhd")],
        DEADLINE,
    );
    assert!(!run.status.success(), "{}", run.all());
    assert!(
        run.stdout
            .contains("rhd needs a power-of-two world size, got 3 ranks"),
        "{}",
        run.all()
    );
}

#[test]
fn nonblocking_completed_out_of_order() {
    for transport in ["tcp", "shm"] {
        run_ok(
            3,
            &[("GW_TRANSPORT", transport)],
            &["nonblocking"],
            "nonblocking ok",
        );
    }
}

#[test]
fn stress_1000_random_collectives_on_4_ranks() {
    run_ok(
        4,
        &[],
        &["stress", "1000"],
        "stress ok: 1000 random collectives",
    );
    run_ok(
        4,
        &[("GW_TRANSPORT", "tcp")],
        &["stress", "300"],
        "stress ok: 300 random collectives",
    );
}

#[test]
fn bad_calls_are_refused_before_anything_is_sent() {
    let out = run_ok(2, &[], &["refusals"], "refusals ok");
    for want in [
        "avg",
        "int32",
        "weight",
        "differ in length",
        "root 2",
        "overflows",
    ] {
        assert!(
            out.contains(want),
            "refusal messages should mention {want:?}: {out}"
        );
    }
}

#[test]
fn mismatched_collectives_fail_on_every_rank_naming_both_calls() {
    for transport in ["tcp", "shm"] {
        let job = DirectJob::new();
        let runs = job.run(
            &[0, 1, 2],
            3,
            &["collective-mismatch"],
            &[("GW_TRANSPORT", transport), ("GW_TIMEOUT", "20")],
            Duration::from_secs(60),
        );
        for (r, run) in runs.iter().enumerate() {
            assert!(!run.status.success(), "rank {r} must fail: {}", run.all());
            assert!(
                run.stdout.contains("all_reduce(") && run.stdout.contains("broadcast("),
                "{transport}: rank {r} must name both calls: {}",
                run.all()
            );
            // The failure is found inside a call the caller's thread runs
            // (`gw_logging::enter` stands in for the communicator's span
            // there): its line still names the rank.
            let line = format!("gradwire WARN rank {r}: communicator failed");
            assert!(
                run.stderr.contains(&line),
                "{transport}: rank {r} must log {line:?}: {}",
                run.all()
            );
            assert!(
                run.elapsed < Duration::from_secs(20),
                "rank {r} took {:?}",
                run.elapsed
            );
        }
    }
}

#[test]
fn fused_small_tensors_equal_one_by_one_all_reduces() {
    // A 1 MiB fusion buffer: the 300,000-element tensors go alone, the rest are packed.
    for transport in ["tcp", "shm"] {
        run_ok(
            3,
            &[("GW_TRANSPORT", transport), ("GW_FUSION_BYTES", "1048576")],
            &["fusion"],
            "fusion ok: 200 tensors",
        );
    }
}

/// Every rank chooses algorithms from rank 0's cost model, whatever its own
/// calibration file says, so ranks on different hardware never disagree.
#[test]
fn every_rank_uses_rank_zeros_cost_model() {
    let dir = std::env::temp_dir().join(format!("gw-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Rank 0: expensive messages, so recursive doubling (two rounds, a fold
    // and a hand-back) beats the tree (6 messages) and the ring's 10 steps
    // for small sizes on 6 ranks. The others: free messages, where the ring
    // always wins.
    let slow =
        "gradwire-model v1 tcp_alpha=1e-3 tcp_beta=1e-9 shm_alpha=1e-3 shm_beta=1e-9 gamma=1e-10";
    let fast = "gradwire-model v1 tcp_alpha=0 tcp_beta=1e-9 shm_alpha=0 shm_beta=1e-9 gamma=1e-10";
    let files: Vec<_> = (0..6)
        .map(|r| {
            let f = dir.join(format!("model-{r}"));
            std::fs::write(&f, if r == 0 { slow } else { fast }).unwrap();
            f.display().to_string()
        })
        .collect();
    let job = gw_tests::DirectJob::new();
    let children: Vec<_> = (0..6u32)
        .map(|r| job.spawn(r, 6, &["model"], &[("GW_MODEL_FILE", &files[r as usize])]))
        .collect();
    let lines: Vec<String> = children
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let run = gw_tests::collect(c, DEADLINE, &format!("rank {r}"));
            assert!(run.status.success(), "rank {r}: {}", run.all());
            run.stdout
                .lines()
                .find(|l| l.contains("model "))
                .unwrap_or_else(|| panic!("rank {r} printed no model: {}", run.all()))
                .to_string()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(lines[0].contains("tcp_alpha=1e-3"), "{}", lines[0]);
    assert!(lines[0].contains("8:rd"), "{}", lines[0]);
    assert!(lines[0].contains("67108864:ring"), "{}", lines[0]);
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(
            l.split_once("model ").map(|x| x.1),
            lines[0].split_once("model ").map(|x| x.1),
            "rank {r}"
        );
    }
}

/// At init, `GW_DEBUG=info` says whether device memory could move by
/// GPUDirect RDMA and, if not, why (issue 25): here no transport has a
/// NIC, libfabric's tcp provider offers no FI_HMEM, and its shm provider's
/// FI_HMEM is CUDA IPC within a host.
#[test]
fn init_says_whether_gpudirect_rdma_is_possible_and_why_not() {
    for (env, want) in [
        (
            vec![("GW_TRANSPORT", "shm")],
            "GPUDirect RDMA: off (no RDMA transport in use: shm;",
        ),
        (
            vec![("GW_TRANSPORT", "tcp")],
            "GPUDirect RDMA: off (no RDMA transport in use: tcp;",
        ),
        (
            vec![("GW_TRANSPORT", "ofi"), ("GW_OFI_PROVIDER", "tcp;ofi_rxm")],
            "GPUDirect RDMA: off (provider tcp;ofi_rxm offers no FI_HMEM",
        ),
        (
            vec![("GW_TRANSPORT", "ofi"), ("GW_OFI_PROVIDER", "shm")],
            "GPUDirect RDMA: off (provider shm moves data within one host",
        ),
    ] {
        let mut env = env;
        env.push(("GW_DEBUG", "info"));
        let run = gwrun(2, "gwtest", &["collectives", "7"], &env, DEADLINE);
        assert!(run.status.success(), "{env:?}: {}", run.all());
        let lines = run.all().matches(want).count();
        assert_eq!(
            lines,
            2,
            "{env:?}: want {want:?} from each rank: {}",
            run.all()
        );
    }
}
