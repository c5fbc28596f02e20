//! Maps only files in `/dev/shm` that this user made private.
//!
//! `/dev/shm` is writable by every local user, so what sits at a segment's
//! name may be someone else's: a file whose contents they control, or a
//! symbolic link to a file of ours they want written over. A segment is
//! opened without following links and used only if it is a regular file of
//! this process's effective user that nobody else may open; anything else is
//! refused with an error naming the path, its owner and its mode.

use crate::error::{Error, Result};
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path`, the segment of ranks `pair`, read-write without following
/// a symbolic link, and checks that the file is private to this user.
/// `Ok(None)`: nothing is there.
pub(crate) fn open_private(path: &Path, pair: impl Into<Whose>) -> Result<Option<File>> {
    let pair = pair.into();
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        // O_NONBLOCK: a FIFO put at the name must not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refusal(path, pair, "a symbolic link".into()));
        }
        Err(e) => return Err(Error::sys("open", format!("opening {}", path.display()), e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::sys("fstat", path.display().to_string(), e))?;
    check_private(path, pair, &meta)?;
    Ok(Some(file))
}

/// Checks what already sits at `path`, the segment of ranks `pair` (found
/// by a create that failed with `EEXIST`), before it is taken for a
/// leftover of ours and removed.
pub(crate) fn check_existing(path: &Path, pair: impl Into<Whose>) -> Result<()> {
    let pair = pair.into();
    match std::fs::symlink_metadata(path) {
        Ok(meta) => check_private(path, pair, &meta),
        // Gone meanwhile: the create is simply tried again.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::sys("lstat", path.display().to_string(), e)),
    }
}

fn check_private(path: &Path, pair: Whose, meta: &Metadata) -> Result<()> {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        Some("a symbolic link")
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_block_device() || ft.is_char_device() {
        Some("a device")
    } else {
        None
    };
    if let Some(kind) = kind {
        return Err(refusal(path, pair, kind.into()));
    }
    let mode = meta.mode() & 0o7777;
    if meta.uid() != euid() || mode & 0o077 != 0 {
        return Err(refusal(
            path,
            pair,
            format!("owned by uid {} with mode {mode:04o}", meta.uid()),
        ));
    }
    Ok(())
}

/// Whose file a path is meant to be: a pair's segment, or a host region.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Whose {
    Pair(u32, u32),
    HostRegion,
}

impl From<(u32, u32)> for Whose {
    fn from((lo, hi): (u32, u32)) -> Whose {
        Whose::Pair(lo, hi)
    }
}

fn refusal(path: &Path, whose: Whose, what: String) -> Error {
    let as_what = match whose {
        Whose::Pair(lo, hi) => format!("the shared segment of ranks {lo} and {hi}"),
        Whose::HostRegion => "a host region".to_owned(),
    };
    Error::Config(format!(
        "refusing {} as {as_what}: it is {what}, but gradwire \
         maps only regular files of this user (uid {}) that no one else may open (mode 0600); \
         another local user may have created it: remove it, or set GW_TRANSPORT=tcp",
        path.display(),
        euid()
    ))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A scratch path in /dev/shm (the file system segments live on),
    /// removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let p = Path::new(super::super::segment::SHM_DIR)
                .join(format!("gwtest-private-{}-{name}", std::process::id()));
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_dir(&p);
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    fn refused(r: Result<impl Sized>, path: &Path, what: &str) {
        let e = match r {
            Ok(_) => panic!("{} was accepted", path.display()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains(what), "{e} should say {what}");
        assert!(e.contains("GW_TRANSPORT=tcp"), "{e}");
    }

    #[test]
    fn private_files_of_ours_are_opened_and_absent_ones_are_none() {
        let s = Scratch::new("ok");
        assert!(open_private(&s.0, (0, 1)).expect("absent").is_none());
        std::fs::write(&s.0, b"x").expect("write");
        std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(open_private(&s.0, (0, 1)).expect("ours").is_some());
        check_existing(&s.0, (0, 1)).expect("ours");
    }

    #[test]
    fn links_other_kinds_open_modes_and_other_owners_are_refused() {
        let target = Scratch::new("target");
        std::fs::write(&target.0, b"x").expect("write");
        std::fs::set_permissions(&target.0, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let link = Scratch::new("link");
        std::os::unix::fs::symlink(&target.0, &link.0).expect("symlink");
        refused(open_private(&link.0, (0, 1)), &link.0, "a symbolic link");
        refused(check_existing(&link.0, (0, 1)), &link.0, "a symbolic link");

        let dir = Scratch::new("dir");
        std::fs::create_dir(&dir.0).expect("mkdir");
        refused(check_existing(&dir.0, (0, 1)), &dir.0, "a directory");

        let open = Scratch::new("open");
        std::fs::write(&open.0, b"x").expect("write");
        std::fs::set_permissions(&open.0, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mode = format!("owned by uid {} with mode 0644", euid());
        refused(open_private(&open.0, (0, 1)), &open.0, &mode);
        refused(check_existing(&open.0, (0, 1)), &open.0, &mode);

        // Another user's private file: only root can make one to test with.
        if euid() == 0 {
            let theirs = Scratch::new("theirs");
            std::fs::write(&theirs.0, b"x").expect("write");
            std::fs::set_permissions(&theirs.0, std::fs::Permissions::from_mode(0o600))
                .expect("chmod");
            std::os::unix::fs::chown(&theirs.0, Some(65534), None).expect("chown");
            let what = "owned by uid 65534 with mode 0600";
            refused(open_private(&theirs.0, (0, 1)), &theirs.0, what);
            refused(check_existing(&theirs.0, (0, 1)), &theirs.0, what);
        }
    }
}
