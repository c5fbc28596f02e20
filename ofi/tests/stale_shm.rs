//! A process SIGKILLed while it had a libfabric `shm` endpoint leaves the
//! endpoint's region in /dev/shm, named after its pid (`pid:uid:index`).
//! Pids are reused (pid_max is 32768 on many hosts), and a later process
//! with the same pid then had `fi_enable` fail with EBUSY on its first
//! endpoint. This test, a process of its own, plants such leftovers for its
//! own pid and opens endpoints over them.

mod common;

use common::*;

#[test]
fn leftover_regions_of_a_dead_process_with_our_pid_do_not_block_endpoints() {
    if let Some(why) = skip_reason() {
        println!("skipped: {why}");
        return;
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let pid = std::process::id();
    let planted: Vec<String> = (0..4)
        .map(|i| format!("/dev/shm/{pid}:{uid}:{i}"))
        .collect();
    for p in &planted {
        std::fs::write(p, b"left by a dead process").expect("planting a leftover region");
    }
    // An unrelated file of another name is not ours to remove.
    let other = format!("/dev/shm/gw-stale-test-{pid}");
    std::fs::write(&other, b"x").unwrap();
    let opened = pair("shm").map(|(a, b, ..)| (a, b));
    assert!(
        std::path::Path::new(&other).exists(),
        "an unrelated file was removed"
    );
    let _ = std::fs::remove_file(&other);
    let Some((a, b)) = opened else {
        return;
    };
    drop((a, b));
    for p in &planted {
        let _ = std::fs::remove_file(p);
    }
}
