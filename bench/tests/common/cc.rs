//! Builds one of the crate's C programs with the system's C compiler, warnings
//! as errors, for the tests that run them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `src` (relative to the crate) built into `<temp>/<dir>-<pid>/`, a
/// directory of the caller's own, since tests run in parallel.
pub fn build(src: &str, dir: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let dir = std::env::temp_dir().join(format!("{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join(src.file_stem().expect("a file name"));
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
