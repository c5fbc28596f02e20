//! gwStepBegin / gwStepEnd from C (tests/c/step.c, compiled with the real C
//! compiler against include/gradwire.h and libgradwire.so): the error paths
//! without a job server and with one that is down, and a run of steps
//! against a minimal job server written here that speaks the JSON contract
//! of `POST /v1/jobs/{id}/step/begin|end` (and first answers 503 once, so the
//! retry path is taken from C too). And the same against a real `gwjob
//! serve` (from this target directory: `cargo build --workspace --bins`
//! first, as scripts/test.sh does), driven over HTTP as an agent would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>`: the test executable lives in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn compile(src: &Path, name: &str) -> PathBuf {
    let so = profile_dir().join("libgradwire.so");
    assert!(
        so.exists(),
        "{} is missing: build the gw-capi cdylib (cargo build -p gw-capi)",
        so.display()
    );
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-I")
        .arg(manifest().join("include"))
        .arg("-L")
        .arg(profile_dir())
        .args(["-lgradwire", "-lpthread", "-lm"])
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs step.c with `args` (the mode first) and only the given GW_* variables.
fn step_c(args: &[&str], env: &[(&str, String)]) -> (Output, String) {
    let exe = compile(
        &manifest().join("tests/c/step.c"),
        &format!("step_c_{}", args[0]),
    );
    let mut cmd = Command::new(exe);
    cmd.args(args).env("LD_LIBRARY_PATH", profile_dir());
    for (k, _) in std::env::vars() {
        if k.starts_with("GW_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running step.c");
    let text = format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn without_a_job_server_the_step_calls_say_why() {
    let (out, text) = step_c(&["errors"], &[]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("step.c: errors ok"), "{text}");
}

#[test]
fn a_job_server_that_stays_down_is_a_timeout_naming_it() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (out, text) = step_c(
        &["down"],
        &[
            ("GW_JOB_SERVER", format!("http://127.0.0.1:{port}")),
            ("GW_JOB_ID", "j".into()),
            ("GW_JOB_TOKEN", "t".into()),
            ("GW_JOB_RETRY_S", "0.5".into()),
        ],
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("step.c: down ok"), "{text}");
}

/// A request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    auth: String,
    body: String,
}

/// The integer after `"key":` in a flat JSON object.
fn json_u64(body: &str, key: &str) -> Option<u64> {
    let at = body.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = body[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn read_request(s: &TcpStream) -> Option<Seen> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let (mut len, mut auth) = (0usize, String::new());
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        if h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        if k.eq_ignore_ascii_case("content-length") {
            len = v.trim().parse().ok()?;
        } else if k.eq_ignore_ascii_case("authorization") {
            auth = v.trim().to_owned();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Seen {
        path,
        auth,
        body: String::from_utf8(body).ok()?,
    })
}

/// Serves job `j7` for rank 0 of 3 (local batch 4 of 12): 503 for the very
/// first request, then plans for any step, and `stop` once step 2 ends.
fn fake_job_server(l: TcpListener, seen: Arc<Mutex<Vec<Seen>>>) {
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let Some(req) = read_request(&s) else {
                continue;
            };
            let first = {
                let mut v = seen.lock().unwrap();
                v.push(req.clone());
                v.len() == 1
            };
            let step = json_u64(&req.body, "step").unwrap_or(u64::MAX);
            let (status, body) = if first {
                (503, r#"{"error":"starting"}"#.to_owned())
            } else if req.auth != "Bearer tok7" {
                (401, r#"{"error":"bad token"}"#.to_owned())
            } else if req.path == "/v1/jobs/j7/step/begin" {
                (
                    200,
                    format!(
                        r#"{{"step":{step},"global_batch":12,"local_batch":4,"offset":0,"weight":0.3333333333333333,"algo":"ring","predicted_step_s":null}}"#
                    ),
                )
            } else if req.path == "/v1/jobs/j7/step/end" {
                (200, format!(r#"{{"stop":{}}}"#, step >= 2))
            } else {
                (404, r#"{"error":"no such path"}"#.to_owned())
            };
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(reply.as_bytes());
        }
    });
}

#[test]
fn steps_run_against_a_job_server_until_it_says_stop() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    fake_job_server(l, seen.clone());
    let (out, text) = step_c(
        &["run"],
        &[
            ("GW_JOB_SERVER", format!("http://{addr}")),
            ("GW_JOB_ID", "j7".into()),
            ("GW_JOB_TOKEN", "tok7".into()),
            ("GW_RANK", "0".into()),
        ],
    );
    assert!(out.status.success(), "{text}");
    for s in 0..3 {
        assert!(
            text.contains(&format!(
                "step.c: step {s} local 4 offset 0 global 12 weight 0.333 algo ring predicted nan"
            )),
            "{text}"
        );
    }
    assert!(text.contains("step.c: stopped after 3 steps"), "{text}");
    assert!(text.contains("step.c: run ok"), "{text}");
    let seen = seen.lock().unwrap().clone();
    // 503, then per step: begin, begin again, end.
    assert_eq!(seen.len(), 1 + 3 * 3, "{seen:#?}");
    let ends: Vec<&Seen> = seen.iter().filter(|s| s.path.ends_with("/end")).collect();
    for (i, e) in ends.iter().enumerate() {
        assert_eq!(json_u64(&e.body, "step"), Some(i as u64), "{e:?}");
        assert_eq!(json_u64(&e.body, "samples"), Some(4), "{e:?}");
        assert!(e.body.contains("\"global_grad_sq\":null"), "{e:?}");
        assert!(
            e.body.contains(&format!("\"local_grad_sq\":{}.0", i + 1)),
            "{e:?}"
        );
    }
}

/// A `gwjob serve` child on 127.0.0.1:0, killed on drop.
struct Serve {
    child: std::process::Child,
    url: String,
    dir: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const ADMIN: &str = "capi-step-admin-token";

fn serve() -> Serve {
    let gwjob = profile_dir().join("gwjob");
    assert!(
        gwjob.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests",
        gwjob.display()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("capi-step-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(gwjob)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("db"))
        .env("GW_ADMIN_TOKEN", ADMIN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn gwjob serve");
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut url = None;
    for line in out.lines() {
        let Ok(line) = line else { break };
        if let Some(u) = line.strip_prefix("gwjob: listening on ") {
            url = Some(u.to_owned());
            break;
        }
    }
    let url = url.expect("gwjob serve printed its address");
    Serve { child, url, dir }
}

#[test]
fn steps_against_a_real_gwjob_serve_then_a_cancelled_job_is_aborted() {
    use gw_jobapi::http::call;
    use gw_jobapi::types::*;
    let s = serve();
    let t = Duration::from_secs(10);
    let node = RegisterNode {
        node: "n0".into(),
        rack: "r0".into(),
        slots: 1,
        device_type: "cpu".into(),
        addr: "127.0.0.1".into(),
    };
    let _: RegisterReply =
        call("POST", &s.url, "/v1/nodes/register", ADMIN, Some(&node), t).expect("register");
    let req = SubmitRequest {
        name: None,
        workers: 1,
        global_batch: 8,
        batch_lo: 1,
        batch_hi: 8,
        schedule: vec![],
        planner: PlannerKind::Optperf,
        program: "/bin/true".into(),
        args: vec![],
        env: vec![("GW_ALGO".into(), "ring".into())],
        steps: None,
        throughput: vec![],
    };
    let id = call::<_, SubmitReply>("POST", &s.url, "/v1/jobs", ADMIN, Some(&req), t)
        .expect("submit")
        .job_id;
    // Play the agent: open the store, get the launch with the job's variables.
    let hb = "/v1/nodes/n0/heartbeat";
    let r: HeartbeatReply =
        call("POST", &s.url, hb, ADMIN, Some(&Heartbeat::default()), t).expect("heartbeat");
    assert!(r.open_stores.iter().any(|o| o.job_id == id), "{r:?}");
    let opened = Heartbeat {
        stores: vec![StoreOpened {
            job_id: id.clone(),
            addr: "127.0.0.1:1".into(),
            attempt: 0,
        }],
        exits: vec![],
    };
    let r: HeartbeatReply = call("POST", &s.url, hb, ADMIN, Some(&opened), t).expect("heartbeat");
    let launch = r
        .launches
        .into_iter()
        .find(|l| l.job_id == id)
        .expect("a launch for the job");
    let var = |k: &str| {
        launch
            .env
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{k} in {launch:?}"))
    };
    let vars = [
        ("GW_JOB_SERVER", var("GW_JOB_SERVER")),
        ("GW_JOB_ID", var("GW_JOB_ID")),
        ("GW_JOB_TOKEN", var("GW_JOB_TOKEN")),
    ];

    let (out, text) = step_c(&["run", "3"], &vars);
    assert!(out.status.success(), "{text}");
    for step in 0..3 {
        let want = format!("step.c: step {step} local 8 offset 0 global 8 weight 1.000 algo ring");
        assert!(text.contains(&want), "{want:?} in\n{text}");
    }
    assert!(text.contains("step.c: done after 3 steps"), "{text}");
    let st: JobStatus =
        call::<(), _>("GET", &s.url, &format!("/v1/jobs/{id}"), ADMIN, None, t).expect("status");
    assert_eq!(st.step, Some(2), "{st:?}");
    assert_eq!(st.ranks[0].last_compute_s, Some(0.25), "{st:?}");

    let _: JobStatus = call::<(), _>(
        "POST",
        &s.url,
        &format!("/v1/jobs/{id}/cancel"),
        ADMIN,
        None,
        t,
    )
    .expect("cancel");
    let (out, text) = step_c(&["stopped"], &vars);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "step.c: begin of a stopped job: job {id} stopped: was cancelled"
        )),
        "{text}"
    );
}
