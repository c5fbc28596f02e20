//! Two processes, one endpoint each: the test binary re-runs itself as a
//! child (`GW_OFI_CHILD` names the provider), and the two exchange
//! endpoint names, and the child's region address and key, through files
//! in a temporary directory. The parent writes 1 MiB into the child's
//! region with an immediate; the child checks the bytes and answers with
//! a message, and waits for the parent's goodbye before exiting.

mod common;

use common::*;
use gw_ofi::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const CHILD_ENV: &str = "GW_OFI_CHILD";
const DIR_ENV: &str = "GW_OFI_CHILD_DIR";
const LEN: usize = 1 << 20;
const IMM: u64 = 0x0dd5_eed5;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Writes `text` to `dir/name` so that a reader never sees half of it.
fn publish(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

/// Waits for `dir/name`, failing if `child` exits first or time runs out.
fn await_file(dir: &Path, name: &str, mut child: Option<&mut Child>) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(dir.join(name)) {
            return s;
        }
        if let Some(c) = child.as_deref_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!("the child exited ({status}) before writing {name}");
        }
        assert!(start.elapsed() < DEADLINE, "no {name} after {DEADLINE:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn run_parent(prov: &str) {
    let Some(mut me) = open(prov) else { return };
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "gw-ofi-{}-{}",
        std::process::id(),
        prov.replace(';', "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    publish(&dir, "parent", &hex(&me.ep.name().expect("fi_getname")));

    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, prov)
        .env(DIR_ENV, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the child");

    let line = await_file(&dir, "child", Some(&mut child));
    let mut f = line.split_whitespace();
    let (name, addr, key) = (
        unhex(f.next().expect("name")),
        f.next().expect("addr").parse::<u64>().expect("addr"),
        f.next().expect("key").parse::<u64>().expect("key"),
    );
    let peer = me.ep.insert_peer(&name).expect("fi_av_insert");

    let mut src = Buf::new(LEN);
    src.bytes_mut().copy_from_slice(&pattern(LEN, 4242));
    let answer = Buf::new(64);
    // SAFETY: src and answer outlive their registrations; transfers are
    // waited for below.
    let smr = unsafe { me.ep.register(src.ptr(), LEN, FI_WRITE | FI_SEND) }.expect("register");
    // SAFETY: as above.
    let amr = unsafe { me.ep.register(answer.ptr(), 64, FI_RECV) }.expect("register");
    // SAFETY: answer is not read until the receive completes.
    unsafe { me.ep.recv(answer.ptr(), 64, amr.desc(), 1) }.expect("recv");
    let remote = Remote {
        dest: peer,
        addr,
        key,
    };
    post_retry(&mut [&mut me], "fi_writedata", |s| {
        // SAFETY: src is not modified until the write completes.
        unsafe {
            s[0].ep
                .writedata(src.ptr(), LEN, smr.desc(), IMM, remote, 2)
        }
    });
    let start = Instant::now();
    while !(has_ctx(&me, 1) && has_ctx(&me, 2)) {
        poll(&mut me, "the write and the child's answer");
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().expect("child output");
            panic!(
                "the child exited ({status}) early:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{prov}: no answer after {DEADLINE:?}: {:x?}",
            me.seen
        );
    }
    let got = take_ctx(&mut me, 1)[0];
    let text = String::from_utf8_lossy(&answer.bytes()[..got.len]).into_owned();
    post_retry(&mut [&mut me], "fi_inject", |s| {
        s[0].ep.inject(b"bye", peer)
    });
    // Keep progressing until the child has read the goodbye and exited.
    let start = Instant::now();
    let status = loop {
        poll(&mut me, "the goodbye");
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{prov}: the child did not exit after the goodbye");
        }
    };
    let out = child.wait_with_output().expect("child output");
    let child_out = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.success(),
        "{prov}: the child failed ({status}):\n{child_out}"
    );
    assert_eq!(text, "ok", "{prov}: the child said {text:?}:\n{child_out}");
    println!(
        "{prov}: two processes: 1 MiB written with immediate {IMM:#x}, child answered {text:?}"
    );
}

/// The child's side; does nothing unless started by `run_parent`.
#[test]
fn child() {
    let Ok(prov) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("GW_OFI_CHILD_DIR"));
    let mut me = open(&prov).expect("the parent found this provider");
    let parent = unhex(&await_file(&dir, "parent", None));
    let peer = me.ep.insert_peer(&parent).expect("fi_av_insert");
    let target = Buf::new(LEN);
    let bye = Buf::new(64);
    // SAFETY: target and bye outlive their registrations; the process
    // waits for every transfer before exiting.
    let tmr = unsafe { me.ep.register(target.ptr(), LEN, FI_REMOTE_WRITE) }.expect("register");
    // SAFETY: as above.
    let bmr = unsafe { me.ep.register(bye.ptr(), 64, FI_RECV) }.expect("register");
    post_cq_data_receives(&mut me, 1, 100);
    // SAFETY: bye is not read until the receive completes.
    unsafe { me.ep.recv(bye.ptr(), 64, bmr.desc(), 1) }.expect("recv");
    let addr = tmr.remote_addr(target.ptr()).expect("start");
    publish(
        &dir,
        "child",
        &format!(
            "{} {addr} {}",
            hex(&me.ep.name().expect("fi_getname")),
            tmr.key()
        ),
    );
    drive(&mut [&mut me], "the parent's write", |s| has_imm(s[0], IMM));
    let verdict: &[u8] = if target.bytes() == &pattern(LEN, 4242)[..] {
        b"ok"
    } else {
        b"bytes differ"
    };
    post_retry(&mut [&mut me], "fi_inject", |s| {
        s[0].ep.inject(verdict, peer)
    });
    drive(&mut [&mut me], "the parent's goodbye", |s| has_ctx(s[0], 1));
    assert_eq!(&bye.bytes()[..3], b"bye");
}

#[test]
fn tcp_two_processes() {
    if std::env::var_os(CHILD_ENV).is_none() {
        run_parent("tcp;ofi_rxm");
    }
}

#[test]
fn shm_two_processes() {
    if std::env::var_os(CHILD_ENV).is_none() {
        run_parent("shm");
    }
}
