//! The admin token — where it comes from, which files holding it are
//! trusted, how long it must be — and the parts of checking any token:
//! reading the `Authorization` header and comparing in constant time. Which
//! token may call which endpoint is `access.rs`; tokens the server issues
//! to nodes and submitters are `credentials.rs`.

use crate::server::error::{ApiError, ApiResult};
use gw_rendezvous::token::random_hex;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Where the admin token came from, for the startup message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env,
    /// Generated now (or by an earlier run) and kept in this file.
    Generated(PathBuf),
}

/// Resolves the admin token: `--admin-token-file`, else `GW_ADMIN_TOKEN`,
/// else `<db dir>/admin.token`, generated (mode 0600) on the first start and
/// reused afterwards so agents and clients survive a server restart.
pub fn admin_token(
    file: Option<&Path>,
    env: Option<String>,
    db: &Path,
) -> Result<(String, TokenSource), String> {
    if let Some(f) = file {
        let t = read_server_token(f)?;
        return Ok((t, TokenSource::File(f.to_path_buf())));
    }
    if let Some(t) = env.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
        check_length(&t, "GW_ADMIN_TOKEN")?;
        return Ok((t, TokenSource::Env));
    }
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let path = dir.join("admin.token");
    if path.exists() {
        let t = read_server_token(&path)?;
        return Ok((t, TokenSource::Generated(path)));
    }
    let t = random_hex(16).map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    writeln!(f, "{t}").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok((t, TokenSource::Generated(path)))
}

/// Shortest admin token accepted: 16 characters (a generated one has 32
/// hex digits, 128 bits).
pub const MIN_TOKEN_LEN: usize = 16;

/// Reads a token file: the first line, trimmed; empty is an error.
pub fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let t = text.lines().next().unwrap_or("").trim().to_owned();
    if t.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(t)
}

/// The server's own token file: as [`read_token`], and only if the file is
/// private (see [`check_private`]) and the token at least
/// [`MIN_TOKEN_LEN`] long. (Clients send what they are given; the server
/// decides what it accepts.)
fn read_server_token(path: &Path) -> Result<String, String> {
    check_private(path, "token file")?;
    let t = read_token(path)?;
    check_length(&t, &format!("the token in {}", path.display()))?;
    Ok(t)
}

fn check_length(token: &str, what: &str) -> Result<(), String> {
    if token.chars().count() < MIN_TOKEN_LEN {
        return Err(format!(
            "{what} has {} characters; at least {MIN_TOKEN_LEN} are needed \
             (e.g. `head -c 16 /dev/urandom | xxd -p`)",
            token.chars().count()
        ));
    }
    Ok(())
}

/// A file holding secrets is used only if it is a regular file (not a
/// link someone planted), owned by the user running the server, and
/// neither group nor others may read or write it.
pub fn check_private(path: &Path, what: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)
        .map_err(|e| format!("cannot stat {what} {}: {e}", path.display()))?;
    if !m.file_type().is_file() {
        return Err(format!(
            "{what} {} is not a regular file (a symbolic link is refused)",
            path.display()
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(format!(
            "{what} {} is owned by uid {}, not by this server's uid {me}",
            path.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {} has mode {:o}: group and others must have no access \
             (chmod 600 {})",
            path.display(),
            m.mode() & 0o777,
            path.display()
        ));
    }
    Ok(())
}

/// The token of an `Authorization: Bearer TOKEN` header value.
pub fn bearer(header: Option<&str>) -> ApiResult<&str> {
    let h = header.ok_or_else(|| ApiError::unauthorized("missing Authorization header"))?;
    let (scheme, token) = h
        .trim()
        .split_once(' ')
        .ok_or_else(|| ApiError::unauthorized("Authorization must be 'Bearer TOKEN'"))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::unauthorized(
            "Authorization must be 'Bearer TOKEN'",
        ));
    }
    Ok(token)
}

/// Equality whose time does not depend on where the strings differ.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(Some("Bearer abc")).ok(), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")).ok(), Some("abc"));
        assert_eq!(bearer(None).map_err(|e| e.status), Err(401));
        assert!(bearer(Some("Basic abc")).is_err());
        assert!(bearer(Some("Bearer ")).is_err());
        assert!(bearer(Some("abc")).is_err());
    }

    #[test]
    fn constant_time_equality() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("", "a"));
    }

    #[test]
    fn generated_token_is_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gw-auth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("s.db");
        let (t1, src) = admin_token(None, None, &db).unwrap();
        let path = dir.join("admin.token");
        assert_eq!(src, TokenSource::Generated(path.clone()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (t2, _) = admin_token(None, None, &db).unwrap();
        assert_eq!(t1, t2);
        let env = "an-operator-chosen-token";
        let (t3, src) = admin_token(None, Some(env.into()), &db).unwrap();
        assert_eq!((t3.as_str(), src), (env, TokenSource::Env));
        let (t4, _) = admin_token(Some(&path), Some(env.into()), &db).unwrap();
        assert_eq!(t4, t1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tokens_that_others_could_read_or_guess_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gw-auth-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("s.db");
        let short = admin_token(None, Some("xyz".into()), &db).unwrap_err();
        assert!(short.contains("GW_ADMIN_TOKEN has 3 characters"), "{short}");
        // A pre-existing admin.token readable by others, or planted as a
        // link, is not reused.
        let path = dir.join("admin.token");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = admin_token(None, None, &db).unwrap_err();
        assert!(
            open.contains("mode 644") && open.contains("chmod 600"),
            "{open}"
        );
        std::fs::remove_file(&path).unwrap();
        let target = dir.join("elsewhere");
        std::fs::write(&target, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let link = admin_token(None, None, &db).unwrap_err();
        assert!(link.contains("not a regular file"), "{link}");
        // A private file with too short a token.
        let f = dir.join("short.token");
        std::fs::write(&f, "abc\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = admin_token(Some(&f), None, &db).unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
