//! Finding the program, making the job's secrets, and starting the ranks.
//!
//! Ranks are started so that gwrun can always clean up after them:
//! - all ranks share one new process group (led by rank 0), so one `kill(-pgid)`
//!   reaches each rank *and* whatever it forked (`sh -c` children, data
//!   loaders), which would otherwise keep running and hold our output pipes;
//! - each rank asks the kernel for SIGKILL when gwrun dies
//!   (`PR_SET_PDEATHSIG`), so a `kill -9` of gwrun does not leave orphans;
//! - SIGINT/SIGTERM are reset to their default action, because a gwrun started
//!   with them ignored (`nohup`, a background job of a script) would otherwise
//!   pass the ignoring on and make forwarding useless;
//! - stdin is /dev/null: the ranks are not in the terminal's foreground group,
//!   and a read from the terminal would stop them with SIGTTIN.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::args::is_path;

/// Why the program cannot be run; the text completes `gwrun: error: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupError(pub String);

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Resolves PROGRAM the way gwrun documents: a name containing '/' is a path;
/// otherwise look beside the gwrun executable (so `gwrun -n 4 gwbench` finds the
/// gwbench built next to it), then on `PATH`.
pub fn find_program(program: &OsStr) -> Result<PathBuf, LookupError> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let path_var = std::env::var_os("PATH");
    find_program_in(program, exe_dir.as_deref(), path_var.as_deref())
}

/// [`find_program`] with its inputs explicit, for testing.
pub fn find_program_in(
    program: &OsStr,
    exe_dir: Option<&Path>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, LookupError> {
    let shown = Path::new(program).display();
    if is_path(program) {
        let p = Path::new(program);
        return match p.metadata() {
            Err(_) => Err(LookupError(format!("program not found: {shown}"))),
            Ok(m) if m.is_dir() => Err(LookupError(format!("program is a directory: {shown}"))),
            Ok(_) if !is_executable(p) => {
                Err(LookupError(format!("program is not executable: {shown}")))
            }
            Ok(_) => Ok(p.to_path_buf()),
        };
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = exe_dir {
        dirs.push(d.to_path_buf());
    }
    if let Some(pv) = path_var {
        // POSIX: an empty PATH entry means the current directory.
        for d in std::env::split_paths(pv) {
            dirs.push(if d.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                d
            });
        }
    }
    for d in &dirs {
        let cand = d.join(program);
        if cand.metadata().is_ok_and(|m| m.is_file()) && is_executable(&cand) {
            return Ok(cand);
        }
    }
    let beside = exe_dir.map_or_else(String::new, |d| {
        format!("beside gwrun ({}) or ", d.display())
    });
    Err(LookupError(format!(
        "program '{shown}' not found {beside}on PATH"
    )))
}

fn is_executable(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// `n` bytes from /dev/urandom, as lowercase hex.
pub fn random_hex(n: usize) -> io::Result<String> {
    let mut buf = vec![0u8; n];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// What every rank of one job shares.
#[derive(Debug, Clone)]
pub struct RankPlan {
    /// Resolved program path.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub world: usize,
    /// Variables set identically for every rank (GW_STORE, GW_TOKEN, ...).
    pub common_env: Vec<(String, String)>,
    /// Pipe stdout/stderr to gwrun (for tagging) or let ranks inherit them.
    pub pipe_output: bool,
}

impl RankPlan {
    /// The per-rank variables.
    pub fn rank_env(&self, rank: usize) -> Vec<(&'static str, String)> {
        vec![
            ("GW_RANK", rank.to_string()),
            ("GW_WORLD_SIZE", self.world.to_string()),
            ("GW_LOCAL_RANK", rank.to_string()),
            ("GW_LOCAL_SIZE", self.world.to_string()),
        ]
    }

    /// Starts rank `rank`. `pgid` is `None` for the first rank, which becomes
    /// the leader of a new process group; later ranks join `Some(leader)`.
    pub fn spawn(&self, rank: usize, pgid: Option<i32>) -> io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.common_env {
            cmd.env(k, v);
        }
        for (k, v) in self.rank_env(rank) {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        if self.pipe_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.process_group(pgid.unwrap_or(0));
        // SAFETY: getpid is always safe to call.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions (prctl, getppid, signal,
        // _exit); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // gwrun died before the prctl took effect: nobody will signal us.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
                reset_signals_in_child()
            });
        }
        cmd.spawn()
    }
}

/// Gives a forked child default signal handling before it execs: gwrun and
/// the agent block SIGINT/SIGTERM/SIGCHLD on their main thread (see
/// [`super::signals`]) and a fork keeps that mask across exec, so without
/// this a rank would never see the SIGTERM that is meant to stop it.
///
/// # Safety
/// Call only between fork and exec (in `pre_exec`): it uses only
/// async-signal-safe calls.
pub unsafe fn reset_signals_in_child() -> io::Result<()> {
    // SAFETY: plain libc calls on a local sigset, valid in a forked child.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        let mut none = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(none.as_mut_ptr());
        if libc::sigprocmask(libc::SIG_SETMASK, none.as_ptr(), std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gwrun-spawn-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn make(path: &Path, mode: u32) {
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn beside_gwrun_wins_over_path() {
        let d = scratch("beside");
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        make(&a.join("tool"), 0o755);
        make(&b.join("tool"), 0o755);
        let pv = std::env::join_paths([&b]).unwrap();
        let got = find_program_in(OsStr::new("tool"), Some(&a), Some(&pv)).unwrap();
        assert_eq!(got, a.join("tool"));
        let got = find_program_in(OsStr::new("tool"), None, Some(&pv)).unwrap();
        assert_eq!(got, b.join("tool"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn skips_non_executables_and_dirs() {
        let d = scratch("skip");
        make(&d.join("plain"), 0o644);
        std::fs::create_dir_all(d.join("dir")).unwrap();
        let pv = d.clone().into_os_string();
        let e = find_program_in(OsStr::new("plain"), None, Some(&pv)).unwrap_err();
        assert!(e.0.contains("not found"), "{e}");
        assert!(find_program_in(OsStr::new("dir"), None, Some(&pv)).is_err());
        let p = d.join("plain");
        let e = find_program_in(p.as_os_str(), None, None).unwrap_err();
        assert!(e.0.contains("not executable"), "{e}");
        let e = find_program_in(d.join("dir").as_os_str(), None, None).unwrap_err();
        assert!(e.0.contains("directory"), "{e}");
        let e = find_program_in(d.join("nope").as_os_str(), None, None).unwrap_err();
        assert!(e.0.contains("not found"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn not_found_message_names_both_places() {
        let e = find_program_in(
            OsStr::new("zz-nope"),
            Some(Path::new("/opt/gw/bin")),
            Some(OsStr::new("/nonexistent")),
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "program 'zz-nope' not found beside gwrun (/opt/gw/bin) or on PATH"
        );
    }

    #[test]
    fn random_ids() {
        let a = random_hex(16).unwrap();
        let b = random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
        assert_eq!(random_hex(8).unwrap().len(), 16);
    }
}
