//! What another local user can do to a job through `/dev/shm` and the
//! abstract socket namespace: take the names a job id would predict (which
//! no longer matters), or put something at a real name (which is refused
//! with an error naming the path). Real shared memory and real sockets.

use super::tests::{cfg, infos, job, pattern, reg, run, secret, tag};
use super::*;
use crate::seam::Outstanding;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

/// Removes a path (file or directory) on drop, so a failed test leaves
/// nothing in `/dev/shm`.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn plant_file(path: &Path, mode: u32) -> Planted {
    std::fs::write(path, b"squatter").expect("plant a file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    Planted(path.to_owned())
}

fn refused(e: Error, path: &Path, what: &str) {
    let text = e.to_string();
    assert!(matches!(e, Error::Config(_)), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains(what), "{text} should say {what}");
    assert!(text.contains("ranks 0 and 1"), "{text}");
}

/// Names built from the job id alone (how segments and doorbells were named
/// before) are taken: a directory where the segment would be, sockets bound
/// where the doorbells would be. The pair connects, wakes each other's
/// doorbells and exchanges a message all the same, and nothing the job
/// makes in `/dev/shm` mentions its id.
#[test]
fn names_predicted_from_the_job_id_can_be_taken_without_harm() {
    let j = job("oldnames");
    let old_segment = Path::new("/dev/shm").join(format!("gw-{j}-0-1"));
    std::fs::create_dir(&old_segment).expect("squat the old segment name");
    let _planted = Planted(old_segment);
    let _bells: Vec<UnixDatagram> = (0..2)
        .map(|r| {
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(
                format!("gw-{j}-{r}").as_bytes(),
            )
            .expect("abstract name");
            UnixDatagram::bind_addr(&addr).expect("squat an old doorbell name")
        })
        .collect();

    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).expect("rank 0");
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 64)).expect("rank 1");
    let (pa, pb) = (
        mio::Poll::new().expect("poll"),
        mio::Poll::new().expect("poll"),
    );
    a.attach(pa.registry(), 0).expect("rank 0's doorbell");
    b.attach(pb.registry(), 0).expect("rank 1's doorbell");
    assert_eq!(a.connect(1).expect("create"), Readiness::Ready);
    let ours: Vec<String> = std::fs::read_dir("/dev/shm")
        .expect("list /dev/shm")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&j))
        .collect();
    assert_eq!(ours, [format!("gw-{j}-0-1")], "only the squatter's entry");
    assert_eq!(b.connect(0).expect("open"), Readiness::Ready);

    let mut src = pattern(300, 9);
    let mut dst = vec![0u8; 300];
    let (ms, md) = (reg(&mut a, &mut src), reg(&mut b, &mut dst));
    let s = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 300).expect("send"));
    let r = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 300).expect("recv"));
    run(&mut a, &mut b, vec![s], vec![r]);
    assert_eq!(dst, src);
}

/// A file with group or other permissions at the segment's real name (a
/// squatter who learnt it) is neither written over nor removed by the
/// creating rank.
#[test]
fn a_file_open_to_others_at_the_real_name_is_refused_by_the_creator() {
    let j = job("sqcreate");
    let path = segment_path(&secret(&j), 0, 1);
    let _planted = plant_file(&path, 0o644);
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).expect("rank 0");
    let e = a.connect(1).expect_err("a file open to others was used");
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    refused(e, &path, &format!("owned by uid {uid} with mode 0644"));
    assert_eq!(
        std::fs::read(&path).expect("the file is still there"),
        b"squatter"
    );
}

/// A symbolic link at the real name is not followed by the opening rank,
/// even to a file that is private to this user.
#[test]
fn a_symbolic_link_at_the_real_name_is_refused_by_the_opener() {
    let j = job("sqopen");
    let path = segment_path(&secret(&j), 0, 1);
    let target = path.with_extension("target");
    let _target = plant_file(&target, 0o600);
    std::os::unix::fs::symlink(&target, &path).expect("symlink");
    let _link = Planted(path.clone());
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 64)).expect("rank 1");
    refused(
        b.connect(0).expect_err("a symbolic link was followed"),
        &path,
        "a symbolic link",
    );
}

/// A private file of another user at the real name (only root can make
/// one here, so the test runs as root or checks the mode case instead).
#[test]
fn another_users_file_at_the_real_name_is_refused_by_both_ranks() {
    let j = job("squid");
    let path = segment_path(&secret(&j), 0, 1);
    let _planted = plant_file(&path, 0o600);
    // SAFETY: geteuid has no preconditions.
    let want = if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&path, Some(65534), None).expect("chown");
        "owned by uid 65534 with mode 0600".to_owned()
    } else {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        "with mode 0660".to_owned()
    };
    let mut a = ShmTransport::new(0, infos(2), cfg(&j, 2, 64)).expect("rank 0");
    let mut b = ShmTransport::new(1, infos(2), cfg(&j, 2, 64)).expect("rank 1");
    refused(b.connect(0).expect_err("opened"), &path, &want);
    refused(a.connect(1).expect_err("created"), &path, &want);
}
