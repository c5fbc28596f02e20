//! Ranks on two "hosts": separate network namespaces joined by a veth pair,
//! each rank with its own IP address, so that data-plane traffic really
//! crosses interfaces and the automatic transport choice picks TCP (the
//! namespaces have different host ids) on the interface that reaches the store.
//! Skips, saying why, where network namespaces cannot be made.

use gw_tests::bin;
use gw_tests::netns::Namespaces;
use std::process::Command;
use std::time::Duration;

#[test]
fn ranks_in_separate_network_namespaces_exchange_over_tcp() {
    let ns = match Namespaces::create("", 77) {
        Ok(ns) => ns,
        Err(why) => {
            println!("SKIPPED: cannot create network namespaces here ({why})");
            return;
        }
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
