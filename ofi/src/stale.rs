//! Leftover `shm` regions of a dead process that had this process's pid.
//!
//! libfabric's `shm` provider (1.17) backs each endpoint with a file in
//! /dev/shm named `pid:uid:index`, index counting the process's endpoints
//! from 0, and removes it when the endpoint closes or the process takes a
//! catchable signal. A process killed with SIGKILL (a launcher tearing a
//! job down, a test killing a rank) leaves it behind. Pids come round again
//! (pid_max is 32768 on many hosts), and a later process given the same
//! pid then fails its first `fi_enable` with EBUSY, with nothing in the
//! error to say why. Before this process opens its first endpoint, a file
//! of that shape with its own pid can only be such a leftover: no other
//! living process has the pid, and this one has made none yet.

use std::sync::Once;

/// Removes the leftovers, once per process; call before opening an
/// endpoint.
pub(crate) fn remove_leftovers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        remove_in(std::path::Path::new("/dev/shm"), std::process::id(), uid);
    });
}

/// Whether `name` is a region file of process `pid` run by `uid`.
fn is_region_of(name: &str, pid: u32, uid: u32) -> bool {
    let mut parts = name.split(':');
    let (Some(p), Some(u), Some(i), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    p == pid.to_string()
        && u == uid.to_string()
        && !i.is_empty()
        && i.bytes().all(|b| b.is_ascii_digit())
}

fn remove_in(dir: &std::path::Path, pid: u32, uid: u32) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_str().is_some_and(|n| is_region_of(n, pid, uid)) {
            match std::fs::remove_file(e.path()) {
                Ok(()) => tracing::debug!(
                    "ofi: removed {}, left in /dev/shm by a dead process with this pid",
                    e.path().display()
                ),
                Err(err) => tracing::debug!("ofi: could not remove {}: {err}", e.path().display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_region_files_of_this_pid_and_uid_match() {
        assert!(is_region_of("4242:0:0", 4242, 0));
        assert!(is_region_of("4242:1000:17", 4242, 1000));
        for other in [
            "42421:0:0",
            "424:0:0",
            "4242:1:0",
            "4242:0:",
            "4242:0:x",
            "4242:0:0:1",
            "4242:0",
            "gw-4242:0:0",
            "",
        ] {
            assert!(!is_region_of(other, 4242, 0), "{other}");
        }
    }

    #[test]
    fn removes_only_matching_files() {
        let dir = std::env::temp_dir().join(format!("gw-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in ["77:5:0", "77:5:3", "78:5:0", "77:6:0", "keep"] {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        remove_in(&dir, 77, 5);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["77:6:0", "78:5:0", "keep"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
