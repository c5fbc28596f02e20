//! The job server under the attacks a hostile local user can make with
//! nothing but loopback connections: slow bodies, slow or huge headers,
//! idle connections, absurd numbers in a worker's report, and guessing job
//! ids. Each test reproduces the attack against the real `gwjob serve` and
//! checks that the agents and workers it serves keep being served.

mod server_support;

use gw_jobapi::types::*;
use serde_json::{Value, json};
use server_support::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn addr(s: &Server) -> String {
    s.url.trim_start_matches("http://").to_owned()
}

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(addr(s)).expect("connect to the server");
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c
}

/// Reads until the server closes the connection (or `limit` passes):
/// Some(what it sent) if it closed in time.
fn closed_within(c: &mut TcpStream, limit: Duration) -> Option<String> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match c.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(String::from_utf8_lossy(&got).into_owned()),
        }
    }
    None
}

/// A POST head announcing a body that never comes.
fn slow_body(s: &Server, token: Option<&str>, chunked: bool) -> TcpStream {
    let mut c = connect(s);
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let framing = if chunked {
        "Transfer-Encoding: chunked\r\n"
    } else {
        "Content-Length: 100000\r\n"
    };
    write!(
        c,
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n{framing}\r\n"
    )
    .expect("send head");
    c
}

#[test]
fn slow_bodies_and_silent_clients_do_not_stall_heartbeats_or_a_job() {
    let dir = TempDir::new("slow-bodies");
    // Deadlines far beyond the attack, so the attackers are held the whole
    // time: what is tested is that they cost the others nothing.
    let s = Server::start(
        dir.path(),
        &[
            "--node-timeout",
            "2",
            "--heartbeat-ms",
            "200",
            "--body-timeout",
            "60",
            "--header-timeout",
            "60",
            "--stall-timeout",
            "60",
        ],
    );
    let (id, token) = running_job(&s, "n1", &job(1, 8));
    let mut attackers = Vec::new();
    for i in 0..8 {
        attackers.push(slow_body(&s, None, i % 2 == 0));
        attackers.push(slow_body(&s, Some(&s.token), i % 2 == 0));
    }
    for _ in 0..50 {
        attackers.push(connect(&s));
    }
    // Anonymous ones are refused from their head alone, body unread.
    let mut anon = slow_body(&s, None, false);
    let reply = closed_within(&mut anon, Duration::from_secs(5)).expect("anonymous closed");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply:?}");

    // Three node timeouts of heartbeats and steps while they all hang on.
    let start = Instant::now();
    let mut step = 0;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(6) {
        let t = Instant::now();
        s.heartbeat("n1", &Heartbeat::default());
        let plan = s.step_begin(&id, &token, 0, step).expect("step begin");
        assert_eq!(plan.local_batch, 8);
        s.step_end(&id, &token, &end(0, step, 8, 0.01))
            .expect("step end");
        slowest = slowest.max(t.elapsed());
        step += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a heartbeat and a step took {slowest:?}"
    );
    let exit = Heartbeat {
        stores: vec![],
        exits: vec![WorkerExit {
            job_id: id.clone(),
            attempt: 0,
            rank: 0,
            code: Some(0),
            signal: None,
        }],
    };
    s.heartbeat("n1", &exit);
    let st = s.status(&id);
    assert_eq!(st.state, JobState::Succeeded, "{st:?}\n{}", s.stderr());
    assert_eq!(st.step, Some(step - 1));
    assert!(!s.stderr().contains("lost"), "{}", s.stderr());
    drop(attackers);
}

#[test]
fn slow_heads_huge_heads_and_idle_connections_are_cut() {
    let dir = TempDir::new("heads");
    let s = Server::start(
        dir.path(),
        &["--header-timeout", "1", "--stall-timeout", "2"],
    );
    // A header line without end: refused once it passes the size limit,
    // long before 32 MiB have been taken.
    let mut big = connect(&s);
    big.write_all(b"GET /v1/jobs HTTP/1.1\r\nX-Big: ").unwrap();
    let chunk = vec![b'a'; 64 << 10];
    let mut sent = 0usize;
    while sent < 32 << 20 {
        match big.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < 32 << 20, "the server took a 32 MiB header line");
    let reply = closed_within(&mut big, Duration::from_secs(5)).unwrap_or_default();
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 431"),
        "{reply:?}"
    );

    // A head sent one byte every 100 ms never completes within 1 s.
    let mut trickle = connect(&s);
    let start = Instant::now();
    let head =
        b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer 0123456789abcdef\r\n\r\n";
    let mut cut = false;
    for b in head {
        if trickle.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        trickle.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 256];
        let r = trickle.read(&mut probe);
        trickle.set_nonblocking(false).unwrap();
        if matches!(r, Ok(0)) || matches!(&r, Ok(n) if *n > 0) {
            cut = true;
            break;
        }
    }
    assert!(
        cut,
        "a byte-at-a-time head was served for {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );

    // 200 silent connections are all closed after the head deadline, and
    // meanwhile the server answers.
    let mut idle: Vec<TcpStream> = (0..200).map(|_| connect(&s)).collect();
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert!(jobs.is_empty());
    for c in &mut idle {
        assert!(
            closed_within(c, Duration::from_secs(5)).is_some(),
            "a silent connection was kept open"
        );
    }

    // A keep-alive connection left idle after a request is closed too.
    let mut kept = connect(&s);
    write!(
        kept,
        "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        s.token
    )
    .unwrap();
    let t = Instant::now();
    let reply = closed_within(&mut kept, Duration::from_secs(6)).expect("idle keep-alive closed");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn connections_over_the_per_peer_cap_get_503_and_the_cap_frees_up() {
    let dir = TempDir::new("cap");
    let s = Server::start(
        dir.path(),
        &["--max-connections-per-peer", "20", "--header-timeout", "1"],
    );
    let held: Vec<TcpStream> = (0..20).map(|_| connect(&s)).collect();
    let mut over = connect(&s);
    let reply = closed_within(&mut over, Duration::from_secs(5)).expect("refused at once");
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
    // 503 is transient for every client: once the silent ones are cut,
    // the server is reachable again.
    let ok = wait_for(Duration::from_secs(5), || {
        s.call::<(), Vec<JobStatus>>("GET", "/v1/jobs", &s.token, None)
            .ok()
    });
    assert!(ok.is_some(), "{}", s.stderr());
    drop(held);
}

#[test]
fn absurd_reports_are_refused_and_every_listing_survives_a_restart() {
    let dir = TempDir::new("poison");
    let mut s = Server::start_on(dir.path(), "127.0.0.1:0", &["--node-timeout", "60"]);
    let (id, token) = running_job(&s, "n1", &job(1, 8));
    let (other, _) = running_job(&s, "n2", &job(1, 8));
    s.step_begin(&id, &token, 0, 0).expect("begin");
    let with = |f: &dyn Fn(&mut StepEnd)| {
        let mut e = end(0, 0, 8, 0.1);
        f(&mut e);
        e
    };
    let cases: Vec<(StepEnd, &str)> = vec![
        (with(&|e| e.compute_s = 1e308), "compute_s"),
        (with(&|e| e.compute_s = 0.0), "compute_s"),
        (with(&|e| e.compute_s = -1.0), "compute_s"),
        (with(&|e| e.step_s = 2e6), "step_s"),
        (with(&|e| e.comm_s = 1e300), "comm_s"),
        (with(&|e| e.local_grad_sq = Some(1e308)), "local_grad_sq"),
        (with(&|e| e.global_grad_sq = Some(-0.5)), "global_grad_sq"),
        (with(&|e| e.samples = u64::MAX), "samples"),
        (with(&|e| e.step = u64::MAX), "step"),
    ];
    for (report, field) in &cases {
        let r = s.step_end(&id, &token, report);
        assert_eq!(status_of(&r), 400, "{field}: {r:?}");
        assert!(
            message_of(&r).contains(field),
            "{field}: {}",
            message_of(&r)
        );
    }
    let r = s.step_begin(&id, &token, 0, u64::MAX);
    assert_eq!(status_of(&r), 400, "{r:?}");
    // Then real reports are taken, and every view of every job works.
    s.step_end(&id, &token, &end(0, 0, 8, 0.1))
        .expect("a real report");
    s.step_begin(&id, &token, 0, 1)
        .expect("the next step is planned");
    s.kill();
    let s = Server::start_on(dir.path(), "127.0.0.1:0", &["--node-timeout", "60"]);
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|j| j.error.is_none()), "{jobs:?}");
    assert_eq!(s.status(&id).step, Some(0));
    let rank = &s.status(&id).ranks[0];
    assert!(rank.fit_a.is_some_and(f64::is_finite), "{rank:?}");
    let _: JobStatus = s.post(&format!("/v1/jobs/{other}/cancel"), &json!({}));
}

#[test]
fn a_damaged_row_fails_its_own_job_and_no_other() {
    let dir = TempDir::new("damaged");
    let mut s = Server::start_on(dir.path(), "127.0.0.1:0", &["--node-timeout", "60"]);
    let (bad, bad_token) = running_job(&s, "n1", &job(1, 8));
    let (good, good_token) = running_job(&s, "n2", &job(1, 8));
    s.kill();
    // What a crash mid-write, a disk error or an old version could leave.
    let db = rusqlite::Connection::open(&s.db).expect("open the database");
    db.execute(
        "UPDATE ranks SET fit = '{\"forget\":null}' WHERE job_id = ?1",
        [&bad],
    )
    .expect("damage the row");
    drop(db);
    let s = Server::start_on(dir.path(), "127.0.0.1:0", &["--node-timeout", "60"]);
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let (b, g) = (&jobs[0], &jobs[1]);
    assert_eq!(
        (b.job_id.as_str(), g.job_id.as_str()),
        (bad.as_str(), good.as_str())
    );
    let err = b.error.as_deref().unwrap_or("");
    assert!(
        err.contains(&format!("rank fit of job {bad} rank 0")),
        "{b:?}"
    );
    assert!(g.error.is_none() && g.ranks.len() == 1, "{g:?}");
    assert_eq!(s.status(&bad).state, JobState::Running);
    // Its workers get a clear error naming it; the other job steps on.
    let r = s.step_begin(&bad, &bad_token, 0, 0);
    assert_eq!(status_of(&r), 500, "{r:?}");
    assert!(message_of(&r).contains(&bad), "{}", message_of(&r));
    s.step_begin(&good, &good_token, 0, 0)
        .expect("the good job plans");
    // And the operator can still end it.
    let st: JobStatus = s.post(&format!("/v1/jobs/{bad}/cancel"), &json!({}));
    assert_eq!(st.state, JobState::Cancelled);
}

#[test]
fn job_ids_cannot_be_told_apart_from_the_step_endpoints() {
    let dir = TempDir::new("enumerate");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let (id, _) = running_job(&s, "n1", &job(1, 8));
    // At least 96 random bits after the sequence number.
    let random = id.split_once('-').map_or("", |(_, r)| r);
    assert!(
        random.len() >= 24 && random.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let body = json!({"rank": 0, "step": 0});
    let known = s.call::<Value, Value>(
        "POST",
        &format!("/v1/jobs/{id}/step/begin"),
        "x",
        Some(&body),
    );
    let unknown_id = format!("j1-{}", "0".repeat(24));
    let unknown = s.call::<Value, Value>(
        "POST",
        &format!("/v1/jobs/{unknown_id}/step/begin"),
        "x",
        Some(&body),
    );
    assert_eq!((status_of(&known), status_of(&unknown)), (401, 401));
    assert_eq!(
        message_of(&known).replace(&id, "ID"),
        message_of(&unknown).replace(&unknown_id, "ID")
    );
}

#[test]
fn text_that_reaches_the_log_cannot_forge_or_disguise_a_line() {
    let dir = TempDir::new("text");
    let s = Server::start(dir.path(), &[]);
    let node = |device: &str, addr: &str| json!({"node": "n1", "rack": "r1", "slots": 1, "device_type": device, "addr": addr});
    let cases = [
        (
            node("a100\ngwjob INFO: node n9 registered", "10.0.0.1"),
            "device_type",
        ),
        (node("a100", &"1".repeat(300)), "addr"),
        (node("a100", "10.0.0.1\u{202E}"), "addr"),
    ];
    for (body, field) in &cases {
        let r = s.call::<Value, Value>("POST", "/v1/nodes/register", &s.token, Some(body));
        assert_eq!(status_of(&r), 400, "{body}: {r:?}");
        assert!(message_of(&r).contains(field), "{}", message_of(&r));
    }
    let mut bidi = job(1, 8);
    bidi.name = Some("train\u{202E}gpj.exe".into());
    let r = s.call::<_, Value>("POST", "/v1/jobs", &s.token, Some(&bidi));
    assert_eq!(status_of(&r), 400, "{r:?}");
    assert!(
        message_of(&r).contains("name must be printable"),
        "{}",
        message_of(&r)
    );
    assert!(!s.stderr().contains("n9 registered"), "{}", s.stderr());
}
