//! The job server's front door: every endpoint refuses a missing or wrong
//! token with 401 (admin endpoints refuse a job token, step endpoints refuse
//! another job's token and the admin token) and logs who tried; every
//! malformed or absurd submission is a 400 naming the problem, and nothing
//! is stored.

mod server_support;

use gw_jobapi::types::*;
use serde_json::{Value, json};
use server_support::*;

#[test]
fn every_endpoint_class_needs_the_right_token() {
    let dir = TempDir::new("auth");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    let (job_a, token_a) = running_job(&s, "n1", &job(1, 8));
    let (job_b, token_b) = running_job(&s, "n2", &job(1, 8));
    assert_ne!(token_a, token_b);
    assert_ne!(token_a, s.token);

    let admin_paths: Vec<(&str, String, Option<Value>)> = vec![
        (
            "POST",
            "/v1/jobs".into(),
            Some(serde_json::to_value(job(1, 8)).unwrap()),
        ),
        ("GET", "/v1/jobs".into(), None),
        ("GET", format!("/v1/jobs/{job_a}"), None),
        ("GET", format!("/v1/jobs/{job_a}/events"), None),
        ("POST", format!("/v1/jobs/{job_a}/cancel"), None),
        (
            "POST",
            format!("/v1/jobs/{job_a}/global_batch"),
            Some(json!({"step": 5, "global_batch": 8})),
        ),
        (
            "POST",
            "/v1/nodes/register".into(),
            Some(json!({"node": "x", "rack": "r", "slots": 1, "device_type": "cpu", "addr": "a"})),
        ),
        ("POST", "/v1/nodes/n1/heartbeat".into(), Some(json!({}))),
    ];
    for (method, path, body) in &admin_paths {
        for token in ["", "wrong", token_a.as_str()] {
            let r = s.call::<Value, Value>(method, path, token, body.as_ref());
            assert_eq!(status_of(&r), 401, "{method} {path} with {token:?}: {r:?}");
        }
    }
    let step_paths = [
        (
            format!("/v1/jobs/{job_a}/step/begin"),
            json!({"rank": 0, "step": 0}),
        ),
        (
            format!("/v1/jobs/{job_a}/step/end"),
            serde_json::to_value(end(0, 0, 8, 0.1)).unwrap(),
        ),
    ];
    for (path, body) in &step_paths {
        for token in ["", "wrong", token_b.as_str(), s.token.as_str()] {
            let r = s.call::<Value, Value>("POST", path, token, Some(body));
            assert_eq!(status_of(&r), 401, "POST {path} with {token:?}: {r:?}");
        }
    }
    // Nothing was changed by the refused calls...
    let st = s.status(&job_a);
    assert_eq!(st.state, JobState::Running);
    assert_eq!(st.step, None);
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert_eq!(jobs.len(), 2);
    // ...and the right tokens work.
    let plan = s.step_begin(&job_a, &token_a, 0, 0).unwrap();
    assert_eq!(plan.local_batch, 8);
    assert!(s.step_begin(&job_b, &token_b, 0, 0).is_ok());
    // Refusals are logged with the peer address and the path, at most one
    // line a second, the next line counting those left out.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let r = s.call::<Value, Value>("GET", &format!("/v1/jobs/{job_b}"), "wrong", None);
    assert_eq!(status_of(&r), 401);
    let late = format!("GET /v1/jobs/{job_b}");
    let log = s.stderr_when("the late refusal", |l| {
        l.lines()
            .any(|x| x.contains("401 for ") && x.contains(&late))
    });
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("401 for ")).collect();
    assert!(
        lines[0].contains("401 for 127.0.0.1:") && lines[0].contains("POST /v1/jobs"),
        "{log}"
    );
    let last = lines.last().copied().unwrap_or("");
    assert!(last.contains(&late), "{log}");
    // Every refusal is accounted for: a line stands for itself and for the
    // ones it says were left out since the line before. (Which line says
    // so depends on how long the burst took: a burst over a second has a
    // line of its own at the second's turn, and the late one may then have
    // nothing to count.)
    let left_out = |l: &str| -> usize {
        l.rsplit_once(" more like it")
            .and_then(|(head, _)| head.rsplit_once('(')?.1.parse().ok())
            .unwrap_or(0)
    };
    let refusals = admin_paths.len() * 3 + step_paths.len() * 4 + 1;
    assert_eq!(
        lines.iter().map(|l| 1 + left_out(l)).sum::<usize>(),
        refusals,
        "{log}"
    );
    assert!(lines.iter().any(|l| l.contains("more like it")), "{log}");
    assert!(
        lines.len() < refusals,
        "{refusals} refusals logged {} lines:\n{log}",
        lines.len()
    );
    // A missing Authorization header (not just an empty token) is a 401 too.
    let raw = ureq::get(&format!("{}/v1/jobs", s.url)).call();
    assert!(matches!(raw, Err(ureq::Error::Status(401, _))), "{raw:?}");
}

#[test]
fn absurd_submissions_are_refused_and_nothing_is_stored() {
    let dir = TempDir::new("bad-submit");
    let s = Server::start(dir.path(), &[]);
    s.register("n1", "r1", 8);
    let good = serde_json::to_value(job(2, 16)).unwrap();
    let with = |key: &str, v: Value| {
        let mut j = good.clone();
        j[key] = v;
        j
    };
    let cases: Vec<(Value, &str)> = vec![
        (with("workers", json!(0)), "workers must be at least 1"),
        (with("workers", json!(1_000_000)), "maximum"),
        (with("global_batch", json!(1)), "less than workers × LO"),
        (with("global_batch", json!(33)), "more than workers × HI"),
        (with("batch_lo", json!(20)), "LO > HI"),
        (with("batch_lo", json!(0)), "batch_lo"),
        (
            with("planner", json!("fastest")),
            "unknown variant `fastest`",
        ),
        (with("workers", json!(-1)), "bad JSON body"),
        (with("program", json!("")), "program"),
        (
            with("schedule", json!([{"step": 0, "global_batch": 8}])),
            "steps must be > 0",
        ),
        (
            with("schedule", json!([{"step": 5, "global_batch": 1000}])),
            "global batch at step 5",
        ),
        (with("env", json!([["GW_RANK", "1"]])), "GW_RANK"),
        (json!({"workers": 2}), "missing field"),
        (json!("not an object"), "bad JSON body"),
    ];
    for (body, want) in cases {
        let r = s.call::<Value, Value>("POST", "/v1/jobs", &s.token, Some(&body));
        assert_eq!(status_of(&r), 400, "{body}: {r:?}");
        let m = message_of(&r);
        assert!(
            m.contains(want),
            "{body}: message {m:?} should name {want:?}"
        );
    }
    // Not JSON at all.
    let raw = ureq::post(&format!("{}/v1/jobs", s.url))
        .set("Authorization", &format!("Bearer {}", s.token))
        .send_string("{{{");
    assert!(matches!(raw, Err(ureq::Error::Status(400, _))), "{raw:?}");
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert!(jobs.is_empty(), "{jobs:?}");
    // Unknown jobs and endpoints.
    let r = s.call::<(), Value>("GET", "/v1/jobs/nope", &s.token, None);
    assert_eq!(status_of(&r), 404);
    let r = s.call::<(), Value>("GET", "/v1/frobnicate", &s.token, None);
    assert_eq!(status_of(&r), 404);
    let r = s.call::<(), Value>("DELETE", "/v1/jobs", &s.token, None);
    assert_eq!(status_of(&r), 405);
    // Bad node registrations.
    for (body, want) in [
        (
            json!({"node": "a/b", "rack": "r", "slots": 1, "device_type": "cpu", "addr": "x"}),
            "node",
        ),
        (
            json!({"node": "a", "rack": "r", "slots": 0, "device_type": "cpu", "addr": "x"}),
            "slots",
        ),
    ] {
        let r = s.call::<Value, Value>("POST", "/v1/nodes/register", &s.token, Some(&body));
        assert_eq!(status_of(&r), 400, "{body}: {r:?}");
        assert!(message_of(&r).contains(want));
    }
    let r = s.call::<Heartbeat, Value>(
        "POST",
        "/v1/nodes/ghost/heartbeat",
        &s.token,
        Some(&Heartbeat::default()),
    );
    assert_eq!(status_of(&r), 404);
}
