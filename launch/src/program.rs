//! Finding the program a launcher starts.
//!
//! A name containing '/' is a path; otherwise the directory of the running
//! launcher is searched first (so `gwrun -n 4 gwbench` finds the gwbench
//! built next to it), then `PATH`. gwrun looks the program up before it
//! starts anything, so a typo costs nothing and exits 2; the job server's
//! agent looks up each job's program the same way.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Whether a program name is used as a path (contains '/') rather than looked up.
pub fn is_path(program: &OsStr) -> bool {
    program.as_encoded_bytes().contains(&b'/')
}

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
    fn paths() {
        assert!(is_path(OsStr::new("./x")));
        assert!(is_path(OsStr::new("/bin/sh")));
        assert!(!is_path(OsStr::new("sh")));
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
}
