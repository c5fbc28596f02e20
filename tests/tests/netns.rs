//! Ranks on two "hosts": separate network namespaces joined by a veth pair,
//! each rank with its own IP address, so that data-plane traffic really
//! crosses interfaces and the automatic transport choice picks TCP (the
//! namespaces have different host ids) on the interface that reaches the store.
//! Also two namespaces of two ranks each, for hierarchical all-reduce (shm
//! within a namespace, TCP across). Skips, saying why, where network
//! namespaces cannot be made.

use gw_tests::bin;
use gw_tests::netns::Namespaces;
use std::process::Command;
use std::time::Duration;

#[test]
fn ranks_in_separate_network_namespaces_exchange_over_tcp() {
    let Some(ns) = Namespaces::create_or_skip(
        "ranks_in_separate_network_namespaces_exchange_over_tcp",
        "",
        77,
    ) else {
        return;
    };
    let [a, b] = &ns.names;
    let gwrun = bin("gwrun");
    let gwtest = bin("gwtest");
    // gwrun runs in namespace a; each rank enters its own namespace first.
    let wrapper = format!(
        "if [ \"$GW_RANK\" = 0 ]; then n={a}; else n={b}; fi; exec ip netns exec $n {} exchange 0 1 4095 1048579",
        gwtest.display()
    );
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", a])
        .arg(&gwrun)
        .args([
            "-n",
            "2",
            "--store-bind",
            "198.18.77.1:0",
            "--store-addr",
            "198.18.77.1",
            "--timeout",
            "60",
        ])
        .args(["sh", "-c", &wrapper])
        .env("GW_DEBUG", "info");
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning gwrun in a namespace");
    let out = wait_with_deadline(child, Duration::from_secs(120));
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    for r in 0..2 {
        assert!(
            all.contains(&format!("[{r}] rank {r}: exchange ok")),
            "{all}"
        );
    }
    assert!(
        all.contains("transports tcp"),
        "auto must pick TCP across namespaces: {all}"
    );
    // Each rank listens on its own namespace's address.
    assert!(all.contains("listening on 198.18.77.1:"), "{all}");
    assert!(all.contains("listening on 198.18.77.2:"), "{all}");
}

/// Two "hosts" of two ranks each (ranks 0, 1 in namespace a; 2, 3 in b):
/// the automatic transport choice must use shared memory within a namespace
/// (same host id; the abstract Unix sockets that wake shm peers are per
/// network namespace, /dev/shm is shared) and TCP across, and hierarchical
/// all-reduce, forced and chosen by the cost model, must be exact for every
/// dtype, operator, placement and weighting at several sizes. Two ranks on
/// one host and one on the other is refused by hier and costed flat.
#[test]
fn hier_all_reduce_on_two_hosts_of_two_ranks() {
    let Some(ns) = Namespaces::create_or_skip("hier_all_reduce_on_two_hosts_of_two_ranks", "h", 79)
    else {
        return;
    };
    let [a, b] = &ns.names;
    // A fixed cost model (rank 0's is everyone's), so that the automatic
    // choice does not depend on this machine's calibration file: shared
    // memory 4x cheaper than TCP per message and per byte.
    let dir = std::env::temp_dir().join(format!("gw-hier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = dir.join("model");
    std::fs::write(
        &model,
        "gradwire-model v1 tcp_alpha=4e-5 tcp_beta=1e-9 shm_alpha=1e-5 shm_beta=2.5e-10 gamma=1e-10",
    )
    .expect("writing the model file");
    let model = model.display().to_string();
    // Ranks 0 and 1 in namespace a, the rest in b; gwrun runs in a.
    let job = |n: &str, algo: &str, segment: &str, sizes: &str| {
        let wrapper = format!(
            "case \"$GW_RANK\" in 0|1) n={a};; *) n={b};; esac; exec ip netns exec $n {} all-reduce {sizes}",
            bin("gwtest").display()
        );
        let child = Command::new("ip")
            .args(["netns", "exec", a])
            .arg(bin("gwrun"))
            .args([
                "-n",
                n,
                "--store-bind",
                "198.18.79.1:0",
                "--store-addr",
                "198.18.79.1",
                "--timeout",
                "120",
            ])
            .args(["sh", "-c", &wrapper])
            .env("GW_DEBUG", "info")
            .env("GW_TRANSPORT", "auto")
            .env("GW_ALGO", algo)
            .env("GW_SEGMENT_BYTES", segment)
            .env("GW_MODEL_FILE", &model)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawning gwrun in a namespace");
        let out = wait_with_deadline(child, Duration::from_secs(300));
        let all = format!(
            "{n} ranks, GW_ALGO={algo}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), all)
    };
    // Forced, with small segments so that every phase pipelines; then chosen.
    for (algo, segment) in [("hier", "16384"), ("auto", "524288")] {
        let (ok, all) = job("4", algo, segment, "0 1 7 1000 70003 1048589");
        assert!(ok, "{all}");
        let has = |r: u32, what: &str| {
            all.lines()
                .any(|l| l.starts_with(&format!("[{r}] ")) && l.contains(what))
        };
        for r in 0..4u32 {
            assert!(
                has(r, &format!("rank {r}: all-reduce ok:")) && has(r, "transports shm+tcp"),
                "rank {r}: {all}"
            );
            assert!(
                has(r, "hosts by rank: 0 0 1 1 (2 × 2: hier available)"),
                "rank {r}: {all}"
            );
            // shm to the other rank in its namespace, TCP to the other two.
            let host = r / 2;
            for q in (0..4u32).filter(|&q| q != r) {
                let route = if q / 2 == host {
                    "shm (same host)"
                } else {
                    "tcp (other host)"
                };
                assert!(
                    all.lines().any(|l| l.starts_with(&format!("[{r}] "))
                        && l.contains(&format!("rank {r}: rank {q} ("))
                        && l.ends_with(route)),
                    "rank {r} must reach rank {q} by {route}: {all}"
                );
            }
        }
        // Hier talks across hosts only to the rank with the same local
        // index: rank 0 dials 2 and rank 1 dials 3 (the lower rank of a pair
        // dials), never 0-3 or 1-2 as a flat ring over 0..3 would.
        assert!(has(0, "tcp: dialing rank 2"), "{all}");
        assert!(has(1, "tcp: dialing rank 3"), "{all}");
        assert!(!has(0, "tcp: dialing rank 3"), "{all}");
        assert!(!has(1, "tcp: dialing rank 2"), "{all}");
        assert!(has(0, "shm: connected to"), "{all}");
        assert!(has(2, "shm: connected to"), "{all}");
        // The choice is logged at each change, forced or from the model.
        // From the model: recursive doubling for the smallest sizes (two
        // messages, one of them within the host, where hier needs four),
        // hier for the large ones.
        for r in 0..4u32 {
            if algo == "auto" {
                assert!(
                    has(r, "all_reduce of 0 B: rd (predicted")
                        && has(r, ": hier (predicted")
                        && has(r, "hier over 2 hosts × 2 ranks")
                        && !has(r, "forced by GW_ALGO"),
                    "rank {r}: the cost model must choose rd, then hier: {all}"
                );
            } else {
                assert!(has(r, "all_reduce of 0 B: hier (predicted"), "{all}");
                assert!(has(r, "forced by GW_ALGO"), "{all}");
            }
        }
    }
    // Two ranks on one host and one on the other: hier cannot run. Forced,
    // every rank refuses the call naming the layout; chosen, the model falls
    // back to a flat algorithm.
    let (ok, all) = job("3", "hier", "524288", "7");
    assert!(!ok, "{all}");
    assert!(
        all.contains("hier needs the ranks grouped host by host, the same number on each host; here hosts by rank: 0 0 1"),
        "{all}"
    );
    let (ok, all) = job("3", "auto", "524288", "7 1000");
    assert!(ok, "{all}");
    assert!(
        all.contains("(not grouped host by host in equal numbers: no hier)"),
        "{all}"
    );
    assert!(
        all.contains("all_reduce of 7 B: ") && !all.contains(" B: hier (predicted"),
        "{all}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_with_deadline(mut child: std::process::Child, deadline: Duration) -> std::process::Output {
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("collecting output"),
            Ok(None) if start.elapsed() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collecting output");
                panic!(
                    "hung: {}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{e}"),
        }
    }
}
