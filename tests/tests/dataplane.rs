//! The data plane end to end: real rank processes exchanging data over real
//! TCP sockets and real shared memory, and the failures that must be loud.

use gw_tests::{DirectJob, gwrun};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(240);

fn exchange(n: u32, transport: &str, sizes: &[&str]) {
    exchange_with(n, transport, sizes, &[]);
}

fn exchange_with(n: u32, transport: &str, sizes: &[&str], more_env: &[(&str, &str)]) {
    let mut args = vec!["exchange"];
    args.extend_from_slice(sizes);
    let mut env = vec![("GW_TRANSPORT", transport), ("GW_TIMEOUT", "120")];
    env.extend_from_slice(more_env);
    let run = gwrun(n, "gwtest", &args, &env, LONG);
    assert!(run.status.success(), "n={n} {transport}: {}", run.all());
    for r in 0..n {
        let line = format!("[{r}] rank {r}: exchange ok");
        assert!(
            run.stdout.contains(&line),
            "n={n} {transport}: missing {line:?}\n{}",
            run.all()
        );
    }
    if n > 1 {
        assert!(
            run.stdout.contains(&format!("transports {transport}")),
            "{}",
            run.all()
        );
    }
}

#[test]
fn exchange_matrix_tcp() {
    for n in [1, 2, 3, 4, 8] {
        exchange(n, "tcp", &["0", "1", "4095", "1048579"]);
    }
}

#[test]
fn exchange_matrix_shm() {
    for n in [1, 2, 3, 4, 8] {
        exchange(n, "shm", &["0", "1", "4095", "1048579"]);
    }
}

/// The libfabric transport over its tcp provider (scripts/test.sh
/// installs libfabric).
#[test]
fn exchange_matrix_ofi() {
    for n in [2, 3, 4] {
        exchange_with(
            n,
            "ofi",
            &["0", "1", "4095", "1048579"],
            &[("GW_OFI_PROVIDER", "tcp;ofi_rxm")],
        );
    }
}

#[test]
fn exchange_64mib_both_transports() {
    exchange(2, "tcp", &["64M"]);
    exchange(2, "shm", &["64M"]);
    exchange(3, "shm", &["64M"]);
}

/// Sends and receives posted in each rank's own order (all sends first,
/// then shuffled, with an all-reduce among them) all complete: a large
/// send waits for its receive, and that receive must not wait behind the
/// rank's own send. With `GW_TIMEOUT` 30 a wait of that kind fails the run.
fn p2p_overlap(n: u32, transport: &str, iters: &str) {
    let env = [
        ("GW_TRANSPORT", transport),
        ("GW_TIMEOUT", "30"),
        ("GW_OFI_PROVIDER", "tcp;ofi_rxm"),
    ];
    let run = gwrun(n, "gwtest", &["p2p-overlap", iters], &env, LONG);
    assert!(run.status.success(), "n={n} {transport}: {}", run.all());
    for r in 0..n {
        let line = format!("[{r}] rank {r}: p2p-overlap ok: {iters} iterations");
        assert!(
            run.stdout.contains(&line),
            "n={n} {transport}: missing {line:?}\n{}",
            run.all()
        );
    }
    assert!(
        run.stdout.contains(&format!("transports {transport}")),
        "{}",
        run.all()
    );
}

#[test]
fn p2p_in_any_posting_order_shm() {
    for n in [2, 3, 4, 8] {
        p2p_overlap(n, "shm", "40");
    }
}

#[test]
fn p2p_in_any_posting_order_tcp() {
    for n in [2, 3, 4] {
        p2p_overlap(n, "tcp", "40");
    }
}

#[test]
fn p2p_in_any_posting_order_ofi() {
    for n in [2, 4] {
        p2p_overlap(n, "ofi", "12");
    }
}

fn survivors_name_the_dead_rank(transport: &str) {
    let _ = survivors_name_the_dead_rank_in(transport, &["kill-mid-transfer", "1"], "1");
}

/// `args`: gwtest's scenario and its arguments; `one_sided`: `GW_ONE_SIDED`.
/// Returns rank 0's output.
fn survivors_name_the_dead_rank_in(transport: &str, args: &[&str], one_sided: &str) -> String {
    let job = DirectJob::new();
    let runs = job.run(
        &[0, 1, 2],
        3,
        args,
        &[
            ("GW_TRANSPORT", transport),
            ("GW_TIMEOUT", "20"),
            ("GW_OFI_PROVIDER", "tcp;ofi_rxm"),
            ("GW_ONE_SIDED", one_sided),
        ],
        Duration::from_secs(60),
    );
    assert!(
        !runs[1].status.success(),
        "the victim should have died: {}",
        runs[1].all()
    );
    for r in [0, 2] {
        let run = &runs[r];
        assert!(!run.status.success(), "rank {r} should fail: {}", run.all());
        assert!(
            run.stdout.contains("rank 1"),
            "rank {r} must name rank 1: {}",
            run.all()
        );
        assert!(
            run.elapsed < Duration::from_secs(20),
            "rank {r} took {:?}: {}",
            run.elapsed,
            run.all()
        );
    }
    runs[0].all()
}

#[test]
fn peer_killed_mid_transfer_tcp() {
    survivors_name_the_dead_rank("tcp");
}

#[test]
fn peer_killed_mid_transfer_shm() {
    survivors_name_the_dead_rank("shm");
}

#[test]
fn peer_killed_mid_transfer_ofi() {
    survivors_name_the_dead_rank("ofi");
}

/// A rank killed during a persistent all-reduce's rounds (one-sided writes,
/// GW_ONE_SIDED=1, on each transport).
#[test]
fn peer_killed_mid_persistent_round() {
    for transport in ["shm", "ofi", "tcp"] {
        let _ = survivors_name_the_dead_rank_in(transport, &["kill-mid-persistent", "1"], "1");
    }
}

/// The same for rounds through a host region (a small all-reduce over
/// shared memory, `collectives/src/host_rounds.rs`): the survivors find the
/// victim's pid gone.
#[test]
fn peer_killed_mid_host_round() {
    let out = survivors_name_the_dead_rank_in("shm", &["kill-mid-persistent", "1", "256"], "auto");
    assert!(out.contains("host rounds: true"), "{out}");
}

/// The same for 8-byte all-reduces through the host region of small
/// collectives (`collectives/src/host_coll.rs`).
#[test]
fn peer_killed_mid_small_collectives() {
    let out = survivors_name_the_dead_rank_in("shm", &["kill-mid-small", "1"], "auto");
    assert!(out.contains("host region: true"), "{out}");
}

#[test]
fn wrong_token_is_refused() {
    let job = DirectJob::new();
    let runs = job.run(
        &[0],
        1,
        &["init"],
        &[("GW_TOKEN", "not-the-token"), ("GW_TIMEOUT", "5")],
        Duration::from_secs(30),
    );
    assert!(!runs[0].status.success(), "{}", runs[0].all());
    assert!(
        runs[0].stdout.contains("wrong job token"),
        "{}",
        runs[0].all()
    );
}

#[test]
fn unreachable_store_is_named() {
    let job = DirectJob::new();
    let runs = job.run(
        &[0],
        2,
        &["init"],
        &[("GW_STORE", "127.0.0.1:1"), ("GW_TIMEOUT", "2")],
        Duration::from_secs(30),
    );
    assert!(!runs[0].status.success(), "{}", runs[0].all());
    assert!(runs[0].stdout.contains("127.0.0.1:1"), "{}", runs[0].all());
}

#[test]
fn rank_started_twice_is_an_error() {
    let job = DirectJob::new();
    let runs = job.run(
        &[0, 0, 1],
        2,
        &["exchange", "16"],
        &[("GW_TIMEOUT", "10")],
        Duration::from_secs(60),
    );
    let twice: Vec<_> = runs
        .iter()
        .filter(|r| r.stdout.contains("rank 0 was started twice"))
        .collect();
    assert_eq!(
        twice.len(),
        1,
        "exactly one duplicate must be refused: {runs:#?}"
    );
    assert!(!twice[0].status.success());
}

#[test]
fn missing_rank_is_named_at_init() {
    let job = DirectJob::new();
    let runs = job.run(
        &[0, 1],
        3,
        &["init"],
        &[("GW_TIMEOUT", "3")],
        Duration::from_secs(30),
    );
    for run in &runs {
        assert!(!run.status.success(), "{}", run.all());
        assert!(
            run.stdout.contains("rank(s) 2 of 3 never arrived"),
            "{}",
            run.all()
        );
    }
}

#[test]
fn mismatched_fingerprint_names_both_sides() {
    for transport in ["tcp", "shm"] {
        let job = DirectJob::new();
        let runs = job.run(
            &[0, 1],
            2,
            &["mismatch"],
            &[("GW_TRANSPORT", transport), ("GW_TIMEOUT", "10")],
            Duration::from_secs(60),
        );
        let r1 = &runs[1];
        assert!(!r1.status.success(), "{}", r1.all());
        assert!(
            r1.stdout.contains("mismatch")
                && r1.stdout.contains("dtype=int32")
                && r1.stdout.contains("dtype=float"),
            "{transport}: {}",
            r1.all()
        );
    }
}

/// An idle communicator sleeps: after a burst of all-reduces, three idle
/// seconds cost under 1% of a core on every rank, over both transports.
#[test]
fn idle_communicator_uses_under_one_percent_of_a_core() {
    for transport in ["shm", "tcp"] {
        let run = gwrun(
            2,
            "gwtest",
            &["idle-cpu"],
            &[("GW_TRANSPORT", transport)],
            LONG,
        );
        assert!(run.status.success(), "{transport}: {}", run.all());
        assert_eq!(
            run.stdout.matches("idle cpu").count(),
            2,
            "{transport}: {}",
            run.all()
        );
    }
}

/// `GW_TRANSPORT=verbs` on a machine without an RDMA device (this one: its
/// kernel has no InfiniBand support) fails init on every rank with the
/// system's reason, and a build without the `verbs` feature says how to
/// rebuild; `auto` never picks it (every other test runs `auto`).
#[test]
fn verbs_without_a_device_fails_init_with_the_reason() {
    let job = DirectJob::new();
    let runs = job.run(
        &[0, 1],
        2,
        &["init"],
        &[("GW_TRANSPORT", "verbs"), ("GW_TIMEOUT", "10")],
        Duration::from_secs(30),
    );
    for (r, run) in runs.iter().enumerate() {
        assert!(!run.status.success(), "rank {r}: {}", run.all());
        let out = run.all();
        let reason = if gw_verbs::ENABLED {
            "GW_TRANSPORT=verbs: no RDMA device: "
        } else {
            "rebuild with --features verbs"
        };
        assert!(out.contains(reason), "rank {r}: {out}");
    }
}
