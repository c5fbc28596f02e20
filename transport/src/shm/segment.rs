//! The shared segment of one pair of ranks: a file in `/dev/shm`, mapped by both.
//!
//! The lower rank creates `/dev/shm/<name>` (`O_CREAT|O_EXCL`, mode 0600; the
//! name is known only to the job's ranks, see `names.rs`), reserves its space
//! with `posix_fallocate` (so that a too-small `/dev/shm` is an error now,
//! not a `SIGBUS` mid-training), writes the header and sets the ready magic
//! with Release. The higher rank opens it once it exists and is ready
//! (Acquire), checks that both agree on the layout, maps it, and unlinks the
//! name: from then on nothing is left in `/dev/shm` if either process dies. Whoever still holds a name at drop unlinks it. A
//! file found at the name is used, or removed as a leftover, only if it is
//! private to this user (see `private.rs`).
//!
//! ```text
//!   0  magic        u64  "GWSHMSG1" once initialised (Release by the creator)
//!   8  version      u32
//!  12  lo, hi       u32, u32
//!  20  creator pid  u32
//!  24  slots        u64
//!  32  slot_bytes   u64
//!  40  total bytes  u64
//!  48  opened       u32  set by the opener once the name is gone
//! 256  ring lo -> hi   (see ring.rs)
//!      ring hi -> lo
//! ```

use super::names::segment_name;
use super::private::{check_existing, open_private};
use super::ring::{RingRef, ring_bytes};
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Where segments live.
pub(crate) const SHM_DIR: &str = "/dev/shm";
/// Bytes of the segment header in front of the rings.
pub(crate) const SEG_HEADER_LEN: usize = 256;
const MAGIC: u64 = u64::from_le_bytes(*b"GWSHMSG1");
const VERSION: u32 = 2;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_LO: usize = 12;
const OFF_HI: usize = 16;
const OFF_PID: usize = 20;
const OFF_SLOTS: usize = 24;
const OFF_SLOT_BYTES: usize = 32;
const OFF_TOTAL: usize = 40;
const OFF_OPENED: usize = 48;

/// The path of the segment of ranks `lo < hi` for the job's name `secret`.
pub(crate) fn segment_path(secret: &str, lo: u32, hi: u32) -> PathBuf {
    Path::new(SHM_DIR).join(segment_name(secret, lo, hi))
}

/// Ring geometry; both ranks of a pair must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub slots: usize,
    pub slot_bytes: usize,
}

impl Layout {
    fn ring_len(&self) -> usize {
        ring_bytes(self.slots, self.slot_bytes)
    }

    /// Bytes of the whole segment.
    pub(crate) fn total(&self) -> usize {
        SEG_HEADER_LEN + 2 * self.ring_len()
    }
}

/// The error text for a `/dev/shm` too small to hold a segment.
pub(crate) fn too_small_message(path: &Path, needed: u64, free: Option<u64>) -> String {
    let free = match free {
        Some(f) => format!("{f} bytes ({})", human(f)),
        None => "an unknown number of bytes".into(),
    };
    format!(
        "{SHM_DIR} is too small: shared segment {} needs {needed} bytes ({}) but only {free} are free; \
         enlarge {SHM_DIR} (e.g. docker --shm-size), use fewer or smaller shm slots, \
         or set GW_TRANSPORT=tcp to avoid shared memory",
        path.display(),
        human(needed),
    )
}

fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Free bytes for unprivileged users in the file system holding `dir`.
fn free_bytes(dir: &str) -> Option<u64> {
    let c = std::ffi::CString::new(dir).ok()?;
    // SAFETY: statvfs is plain old data, so all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Whether process `pid` may still exist (anything but ESRCH counts as alive).
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if p <= 0 {
        return true; // unknown: never signal a process group
    }
    // SAFETY: signal 0 only checks for existence and permission; no signal is sent.
    let rc = unsafe { libc::kill(p, 0) };
    if rc != 0 {
        return io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    // A killed process stays signalable as a zombie until its parent reaps it;
    // it is dead all the same. The engine asks every few hundred milliseconds
    // while an operation waits, so the path and the file's head live on the
    // stack: a steady-state step must not allocate.
    use std::io::{Read, Write};
    use std::os::unix::ffi::OsStrExt;
    let mut path = [0u8; 32];
    let plen = {
        let mut w = &mut path[..];
        if write!(w, "/proc/{p}/stat").is_err() {
            return true;
        }
        32 - w.len()
    };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path[..plen]));
    // "pid (comm) state ...": comm is at most 16 bytes, so the state letter
    // is well within the first 128 bytes.
    let mut head = [0u8; 128];
    let n = match std::fs::File::open(path).and_then(|mut f| f.read(&mut head)) {
        Ok(n) => n,
        Err(_) => return true,
    };
    let head = &head[..n];
    match head.iter().rposition(|&b| b == b')') {
        Some(i) => !matches!(
            head[i + 1..].iter().find(|b| !b.is_ascii_whitespace()),
            Some(b'Z' | b'X')
        ),
        None => true,
    }
}

/// A segment up to this size is mapped populated, every page mapped at
/// once rather than at its first touch (larger ones, which only settings
/// far from the defaults make, would cost start-up time in proportion).
/// The pages exist already (`posix_fallocate`), so this maps page-table
/// entries only; but a slot's first copy through unmapped pages took
/// 10-25x as long as the next ones, and such a copy is the first sample
/// of what the slots cost (`costs.rs`): with the probes spaced by cost,
/// it kept every 256 KiB message pulled for 800-2,200 messages, where
/// populated the first sample was 2-3x the settled cost and settled
/// within 400. The cost is start-up time (an 8-rank job on 2 cores,
/// 7 segments of 8 MiB a rank: 88-96 ms against 49-55) and resident
/// pages: each process's RSS counts its segments whole from the start.
const POPULATE_MAX: usize = 256 << 20;

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; all shared access
// goes through atomics or the SPSC slot protocol, wherever the owner lives.
unsafe impl Send for Mapping {}

impl Mapping {
    pub(super) fn map(file: &File, len: usize, what: &Path) -> Result<Mapping> {
        Mapping::map_with(file, len, what, false)
    }

    /// [`Mapping::map`], with every page mapped now where `populated` (see
    /// [`POPULATE_MAX`]).
    fn map_with(file: &File, len: usize, what: &Path, populated: bool) -> Result<Mapping> {
        let flags = if populated && len <= POPULATE_MAX {
            libc::MAP_SHARED | libc::MAP_POPULATE
        } else {
            libc::MAP_SHARED
        };
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks
        // the address, so no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::last_os(
                "mmap",
                format!("{} ({len} bytes)", what.display()),
            ));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Internal("mmap returned a null mapping".into()))?;
        Ok(Mapping { ptr, len })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= SEG_HEADER_LEN.min(self.len));
        // SAFETY: `off` is an 8-aligned header offset inside the mapping (which is
        // page aligned and at least SEG_HEADER_LEN long); header words are only
        // accessed atomically.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= SEG_HEADER_LEN.min(self.len));
        // SAFETY: as in `u64_at`, for a 4-aligned offset.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned, and every RingRef into
        // this mapping is owned by the same connection and dropped with it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// What the opener found.
pub(crate) enum Opened {
    /// Not there yet (or not initialised, or a leftover of a dead process).
    Pending,
    Ready(Segment),
}

/// One pair's mapped segment.
#[derive(Debug)]
pub(crate) struct Segment {
    map: Mapping,
    layout: Layout,
    path: PathBuf,
    /// We created the file (we are the lower rank).
    creator: bool,
    /// The name may still exist and we are responsible for it.
    named: bool,
}

impl Segment {
    /// Creates, sizes and initialises the segment (lower rank).
    pub(crate) fn create(path: &Path, layout: Layout, lo: u32, hi: u32) -> Result<Segment> {
        sweep_stale_segments();
        let file = match create_file(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Someone else's file is neither removed nor written over.
                check_existing(path, (lo, hi))?;
                if is_stale(path, Duration::ZERO) {
                    tracing::warn!(
                        "removing stale shared segment {} left by a dead process",
                        path.display()
                    );
                    let _ = std::fs::remove_file(path);
                }
                create_file(path)
            }
            r => r,
        }
        .map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AlreadyExists {
                " (a live process of this user holds it: was this rank started twice?)"
            } else {
                " (set GW_TRANSPORT=tcp to avoid shared memory)"
            };
            Error::sys("open", format!("creating {}{hint}", path.display()), e)
        })?;
        // From here on the name is ours: remove it again on any error.
        let cleanup = |e: Error| {
            let _ = std::fs::remove_file(path);
            e
        };
        let total = layout.total();
        reserve(&file, path, total).map_err(cleanup)?;
        let map = Mapping::map_with(&file, total, path, true).map_err(cleanup)?;
        for base in [SEG_HEADER_LEN, SEG_HEADER_LEN + layout.ring_len()] {
            // SAFETY: the ring lies inside the mapping (total covers both rings),
            // base offsets are multiples of 64 from a page-aligned start, and nobody
            // else uses it before the magic is published.
            unsafe { RingRef::new(map.ptr.as_ptr().add(base), layout.slots, layout.slot_bytes) }
                .init();
        }
        map.u32_at(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        map.u32_at(OFF_LO).store(lo, Ordering::Relaxed);
        map.u32_at(OFF_HI).store(hi, Ordering::Relaxed);
        map.u32_at(OFF_PID)
            .store(std::process::id(), Ordering::Relaxed);
        map.u64_at(OFF_SLOTS)
            .store(layout.slots as u64, Ordering::Relaxed);
        map.u64_at(OFF_SLOT_BYTES)
            .store(layout.slot_bytes as u64, Ordering::Relaxed);
        map.u64_at(OFF_TOTAL).store(total as u64, Ordering::Relaxed);
        map.u32_at(OFF_OPENED).store(0, Ordering::Relaxed);
        map.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Segment {
            map,
            layout,
            path: path.to_owned(),
            creator: true,
            named: true,
        })
    }

    /// Opens, checks, maps and unlinks the segment (higher rank). `creator`
    /// names the lower rank in errors; `creator_pid` is its published pid.
    pub(crate) fn open(
        path: &Path,
        layout: Layout,
        lo: u32,
        hi: u32,
        creator: &str,
        creator_pid: u32,
    ) -> Result<Opened> {
        let Some(file) = open_private(path, (lo, hi))? else {
            return Ok(Opened::Pending);
        };
        let size = file
            .metadata()
            .map_err(|e| Error::sys("fstat", path.display().to_string(), e))?
            .len();
        if size < SEG_HEADER_LEN as u64 {
            return Ok(Opened::Pending); // the creator is still sizing it
        }
        let size = usize::try_from(size)
            .map_err(|_| Error::Protocol(format!("{} is impossibly large", path.display())))?;
        let map = Mapping::map(&file, size, path)?;
        if map.u64_at(OFF_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Ok(Opened::Pending); // not initialised yet
        }
        let pid = map.u32_at(OFF_PID).load(Ordering::Relaxed);
        if pid != creator_pid && !pid_alive(pid) {
            return Ok(Opened::Pending); // a leftover; the creator will replace it
        }
        let bad = |what: String| {
            Error::Protocol(format!(
                "shared segment {} from {creator}: {what}",
                path.display()
            ))
        };
        let version = map.u32_at(OFF_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad(format!(
                "layout version {version}, this rank speaks {VERSION}"
            )));
        }
        let (slo, shi) = (
            map.u32_at(OFF_LO).load(Ordering::Relaxed),
            map.u32_at(OFF_HI).load(Ordering::Relaxed),
        );
        if (slo, shi) != (lo, hi) {
            return Err(bad(format!(
                "made for ranks {slo} and {shi}, expected {lo} and {hi}"
            )));
        }
        let slots = map.u64_at(OFF_SLOTS).load(Ordering::Relaxed);
        let slot_bytes = map.u64_at(OFF_SLOT_BYTES).load(Ordering::Relaxed);
        if (slots, slot_bytes) != (layout.slots as u64, layout.slot_bytes as u64) {
            return Err(Error::Config(format!(
                "{creator} created shared segment {} with {slots} slots of {slot_bytes} bytes, \
                 but this rank (rank {hi}) is configured for {} slots of {} bytes: all ranks must use the same shm settings",
                path.display(),
                layout.slots,
                layout.slot_bytes
            )));
        }
        let total = map.u64_at(OFF_TOTAL).load(Ordering::Relaxed);
        if total != layout.total() as u64 || size != layout.total() {
            return Err(bad(format!(
                "header says {total} bytes and the file has {size}, expected {}",
                layout.total()
            )));
        }
        // Checked: mapped again, populated this time (see `POPULATE_MAX`),
        // where a segment still pending is looked at many times.
        drop(map);
        let map = Mapping::map_with(&file, size, path, true)?;
        // Both sides have it mapped (the creator since before the magic): drop the name.
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::sys("unlink", path.display().to_string(), e)),
        }
        map.u32_at(OFF_OPENED).store(1, Ordering::Release);
        Ok(Opened::Ready(Segment {
            map,
            layout,
            path: path.to_owned(),
            creator: false,
            named: false,
        }))
    }

    /// The ring carrying `lo -> hi` (`0`) or `hi -> lo` (`1`).
    pub(crate) fn ring(&self, which: usize) -> RingRef {
        assert!(which < 2);
        let off = SEG_HEADER_LEN + which * self.layout.ring_len();
        // SAFETY: the ring lies inside the mapping (checked at create/open), is
        // 64-byte aligned, and the returned view is only used while this segment
        // (owned by the same connection) is alive, one producer and one consumer
        // per ring (each rank takes one role).
        unsafe {
            RingRef::new(
                self.map.ptr.as_ptr().add(off),
                self.layout.slots,
                self.layout.slot_bytes,
            )
        }
    }

    /// Whether the segment still has a name in `/dev/shm` that we own.
    pub(crate) fn is_named(&self) -> bool {
        self.named && !(self.creator && self.map.u32_at(OFF_OPENED).load(Ordering::Acquire) != 0)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.is_named() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(super) fn create_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// A segment whose creator is gone, or that never got initialised and is
/// older than `min_age` (an initialisation takes milliseconds).
fn is_stale(path: &Path, min_age: Duration) -> bool {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    let mut h = [0u8; SEG_HEADER_LEN];
    let word = |h: &[u8; SEG_HEADER_LEN], o: usize| {
        u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]))
    };
    if f.read_exact_at(&mut h, 0).is_err() || word(&h, OFF_MAGIC) != MAGIC {
        let age = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        return age.is_some_and(|a| a >= min_age);
    }
    let pid = u32::from_le_bytes(h[OFF_PID..OFF_PID + 4].try_into().unwrap_or([0; 4]));
    pid != std::process::id() && !pid_alive(pid)
}

/// Once per process, removes `gw-*` segments of this user in `/dev/shm` that
/// a killed process left behind (a creator whose peer never opened the
/// segment holds its name until it drops; a process killed before that leaks
/// it, and leaked segments would eventually fill `/dev/shm`).
fn sweep_stale_segments() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
            return;
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        for entry in dir.flatten() {
            if !entry.file_name().to_string_lossy().starts_with("gw-") {
                continue;
            }
            let path = entry.path();
            let ours = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_file() && m.uid() == uid);
            if ours && is_stale(&path, Duration::from_secs(60)) {
                tracing::info!("removing stale shared segment {}", path.display());
                let _ = std::fs::remove_file(&path);
            }
        }
    });
}

/// Gives the file `len` bytes of real backing store.
pub(super) fn reserve(file: &File, path: &Path, len: usize) -> Result<()> {
    let len_off = libc::off_t::try_from(len).map_err(|_| {
        Error::InvalidArgument(format!("shared segment of {len} bytes is too large"))
    })?;
    loop {
        // SAFETY: fd is open for writing; posix_fallocate only touches the file.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            libc::ENOSPC => {
                return Err(Error::sys(
                    "posix_fallocate",
                    too_small_message(path, len as u64, free_bytes(SHM_DIR)),
                    io::Error::from_raw_os_error(rc),
                ));
            }
            libc::EOPNOTSUPP | libc::EINVAL => {
                // A file system without fallocate: size it the plain way.
                return file
                    .set_len(len as u64)
                    .map_err(|e| Error::sys("ftruncate", path.display().to_string(), e));
            }
            _ => {
                return Err(Error::sys(
                    "posix_fallocate",
                    format!("{} ({len} bytes)", path.display()),
                    io::Error::from_raw_os_error(rc),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_small_message_says_what_to_do() {
        let m = too_small_message(Path::new("/dev/shm/gw-j-0-1"), 8_390_144, Some(1_048_576));
        assert!(m.contains("/dev/shm is too small"), "{m}");
        assert!(m.contains("8390144 bytes"), "{m}");
        assert!(m.contains("1048576 bytes (1.0 MiB) are free"), "{m}");
        assert!(m.contains("GW_TRANSPORT=tcp"), "{m}");
        let m = too_small_message(Path::new("/dev/shm/x"), 10, None);
        assert!(m.contains("unknown number of bytes"), "{m}");
        // The full error as a user sees it.
        let e = Error::sys(
            "posix_fallocate",
            m,
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(e.to_string().contains("No space left on device"), "{e}");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(8 << 20), "8.0 MiB");
    }

    #[test]
    fn free_bytes_of_dev_shm() {
        assert!(free_bytes(SHM_DIR).is_some());
    }

    #[test]
    fn pid_liveness() {
        assert!(pid_alive(std::process::id()));
        assert!(pid_alive(0));
        // pid_max is at most 2^22 on Linux.
        assert!(!pid_alive((1 << 22) + 1));
    }

    /// A segment path no other test (or test run) uses.
    fn unique() -> PathBuf {
        segment_path(
            &gw_rendezvous::token::random_hex(16).expect("urandom"),
            0,
            1,
        )
    }

    #[test]
    fn create_open_unlinks_and_checks_layout() {
        let path = unique();
        let layout = Layout {
            slots: 2,
            slot_bytes: 100,
        };
        let pid = std::process::id();
        assert!(matches!(
            Segment::open(&path, layout, 0, 1, "rank 0", pid).unwrap(),
            Opened::Pending
        ));
        let a = Segment::create(&path, layout, 0, 1).unwrap();
        assert!(path.exists());
        assert!(a.is_named());
        let other = Layout {
            slots: 3,
            slot_bytes: 100,
        };
        let e = Segment::open(&path, other, 0, 1, "rank 0 (h)", pid)
            .err()
            .unwrap();
        assert!(e.to_string().contains("same shm settings"), "{e}");
        let Opened::Ready(b) = Segment::open(&path, layout, 0, 1, "rank 0", pid).unwrap() else {
            panic!("not ready")
        };
        assert!(!path.exists());
        assert!(!a.is_named() && !b.is_named());
        drop((a, b));
    }

    #[test]
    fn creator_drop_unlinks() {
        let path = unique();
        let layout = Layout {
            slots: 1,
            slot_bytes: 8,
        };
        let a = Segment::create(&path, layout, 0, 1).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            layout.total() as u64
        );
        drop(a);
        assert!(!path.exists());
    }

    #[test]
    fn staleness() {
        let path = unique();
        std::fs::write(&path, b"").unwrap();
        // Uninitialised: stale only once old enough.
        assert!(is_stale(&path, Duration::ZERO));
        assert!(!is_stale(&path, Duration::from_secs(3600)));
        let _ = std::fs::remove_file(&path);
        // Initialised by a live creator: never stale.
        let a = Segment::create(
            &path,
            Layout {
                slots: 1,
                slot_bytes: 8,
            },
            0,
            1,
        )
        .unwrap();
        assert!(!is_stale(&path, Duration::ZERO));
        // Initialised by a dead creator: stale.
        a.map
            .u32_at(OFF_PID)
            .store((1 << 22) + 1, Ordering::Relaxed);
        assert!(is_stale(&path, Duration::from_secs(3600)));
        drop(a);
    }

    #[test]
    fn stale_leftover_is_replaced() {
        let path = unique();
        // A leftover of ours: private, as `create_file` makes it.
        std::fs::write(&path, b"junk").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let a = Segment::create(
            &path,
            Layout {
                slots: 1,
                slot_bytes: 8,
            },
            0,
            1,
        )
        .unwrap();
        drop(a);
        assert!(!path.exists());
    }
}
