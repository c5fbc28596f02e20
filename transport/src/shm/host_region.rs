//! One region of shared memory that every rank of a host maps, for state
//! that many ranks read at once.
//!
//! A pair's segment (`segment.rs`) carries that pair's frames and nothing
//! else. A persistent all-reduce among the ranks of one host wants the
//! opposite: every rank writes its contribution once where every other
//! rank can read it, and a round then costs a flag per rank instead of a
//! message per pair (`gw_collectives`' `host_rounds.rs` owns the layout;
//! this module only makes, finds and maps the file).
//!
//! The file lives in `/dev/shm` under a name hashed from the job's secret
//! and a key the ranks agree on (`names.rs`), so nobody outside the job
//! can guess or squat it. One rank creates it (`O_EXCL`, mode 0600, its
//! space reserved so a full `/dev/shm` is an error now rather than a
//! `SIGBUS` later); the others open it only after the creator told them it
//! exists (the caller orders that), check it is private to this user and of
//! the agreed size, and map it. The creator removes the name once everyone
//! has mapped it ([`HostRegion::unlink`]); a region still named when
//! dropped is removed then, and one left by a killed process is swept by
//! the next job's first segment (it bears the `gw-` prefix).

use super::names::host_region_name;
use super::private::{Whose, open_private};
use super::segment::{Mapping, SHM_DIR, create_file, reserve};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A mapped host region (see the module comment).
#[derive(Debug)]
pub struct HostRegion {
    map: Mapping,
    path: PathBuf,
    /// The name still exists and this rank created it.
    named: bool,
}

// SAFETY: the region hands out only a raw pointer to shared memory, which
// other processes write at any time anyway; whoever dereferences it says
// how (atomics for the control words). Mapping and unmapping are fine from
// any thread.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Creates and maps the region keyed `key` of `len` bytes, all zero.
    pub fn create(secret: &str, key: u64, len: usize) -> Result<HostRegion> {
        let path = Self::path_of(secret, key)?;
        if len == 0 {
            return Err(Error::InvalidArgument(format!(
                "host region {}: zero bytes",
                path.display()
            )));
        }
        let file = create_file(&path).map_err(|e| {
            Error::sys(
                "open",
                format!("creating host region {} (O_EXCL)", path.display()),
                e,
            )
        })?;
        let made = reserve(&file, &path, len).and_then(|()| Mapping::map(&file, len, &path));
        match made {
            Ok(map) => Ok(HostRegion {
                map,
                path,
                named: true,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Opens and maps the region keyed `key`, which its creator made with
    /// `len` bytes; a missing file, one not private to this user, or one of
    /// another size is an error naming the path.
    pub fn open(secret: &str, key: u64, len: usize) -> Result<HostRegion> {
        let path = Self::path_of(secret, key)?;
        let Some(file) = open_private(&path, Whose::HostRegion)? else {
            return Err(Error::Protocol(format!(
                "host region {} does not exist (its creator is on another host, \
                 or removed it)",
                path.display()
            )));
        };
        let size = file
            .metadata()
            .map_err(|e| Error::sys("fstat", path.display().to_string(), e))?
            .len();
        if size != len as u64 {
            return Err(Error::Protocol(format!(
                "host region {} holds {size} bytes, {len} expected",
                path.display()
            )));
        }
        let map = Mapping::map(&file, len, &path)?;
        Ok(HostRegion {
            map,
            path,
            named: false,
        })
    }

    fn path_of(secret: &str, key: u64) -> Result<PathBuf> {
        super::names::validate_secret(secret)?;
        Ok(Path::new(SHM_DIR).join(host_region_name(secret, key)))
    }

    /// Removes the region's name (the creator, once every rank mapped it);
    /// the mappings stay valid. Does nothing for an opener or a second time.
    pub fn unlink(&mut self) {
        if std::mem::take(&mut self.named) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Where the region starts in this process (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr.as_ptr()
    }

    /// The region's bytes.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Whether process `pid` of this host may still run (a rank sharing a
/// host region, whose peers want to know why it went quiet).
pub fn process_alive(pid: u32) -> bool {
    super::pid_alive(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    const S: &str = "0123456789abcdef0123456789abcdef";

    fn key() -> u64 {
        // Distinct per test run, so parallel runs never meet.
        u64::from(std::process::id()) << 20 | 0x5a5
    }

    #[test]
    fn the_creator_and_an_opener_share_the_bytes_and_the_name_goes() {
        let k = key();
        let mut a = HostRegion::create(S, k, 8192).expect("create");
        let b = HostRegion::open(S, k, 8192).expect("open");
        assert_eq!(b.len(), 8192);
        // SAFETY: both mappings cover 8192 bytes; the word is 8-aligned.
        let (wa, wb) = unsafe {
            (
                &*a.as_ptr().add(4096).cast::<AtomicU64>(),
                &*b.as_ptr().add(4096).cast::<AtomicU64>(),
            )
        };
        assert_eq!(wb.load(Ordering::Acquire), 0, "a new region is zero");
        wa.store(0xfeed, Ordering::Release);
        assert_eq!(wb.load(Ordering::Acquire), 0xfeed);
        let path = a.path().to_owned();
        assert!(path.exists());
        a.unlink();
        assert!(!path.exists());
        // Still mapped on both sides after the name is gone.
        wb.store(7, Ordering::Release);
        assert_eq!(wa.load(Ordering::Acquire), 7);
    }

    #[test]
    fn bad_opens_and_creates_are_refused_with_the_path() {
        let k = key() + 1;
        let e = HostRegion::open(S, k, 4096).unwrap_err().to_string();
        assert!(
            e.contains("does not exist") && e.contains("/dev/shm/gw-"),
            "{e}"
        );
        let a = HostRegion::create(S, k, 4096).expect("create");
        let e = HostRegion::open(S, k, 8192).unwrap_err().to_string();
        assert!(e.contains("holds 4096 bytes, 8192 expected"), "{e}");
        let e = HostRegion::create(S, k, 4096).unwrap_err().to_string();
        assert!(e.contains("O_EXCL"), "{e}");
        let e = HostRegion::create("short", k + 1, 4096)
            .unwrap_err()
            .to_string();
        assert!(e.contains("secret"), "{e}");
        let e = HostRegion::create(S, k + 1, 0).unwrap_err().to_string();
        assert!(e.contains("zero bytes"), "{e}");
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists(), "a named region is removed when dropped");
    }

    #[test]
    fn a_file_others_may_open_is_refused_as_a_host_region() {
        use std::os::unix::fs::OpenOptionsExt;
        let k = key() + 7;
        let path = HostRegion::path_of(S, k).expect("path");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .expect("a file at the name");
        f.set_len(4096).expect("size");
        let e = HostRegion::open(S, k, 4096).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert!(
            e.contains("as a host region") && e.contains("mode 0644"),
            "{e}"
        );
    }
}
