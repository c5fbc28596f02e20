//! The job server's decoding layer fed whatever a client can send: any
//! method and path, any Authorization header, any body bytes, any JSON, and
//! well-formed requests with arbitrary field values. The server is exposed
//! to every host that can reach its port, so none of this may panic or be
//! answered as the server's own fault (5xx): bad input is always a 4xx.
//!
//! These drive [`App`] — routing, token checks, JSON decoding, validation
//! and the handlers in real SQLite transactions — without the HTTP library,
//! which has its own limits and tests (`server_hostile.rs`).

use gw_jobapi::types::*;
use gw_jobserver::server::app::{App, Call};
use gw_jobserver::server::auth::bearer;
use gw_jobserver::server::db::Db;
use gw_jobserver::server::nodes::Liveness;
use gw_jobserver::server::routes;
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

#[path = "common/tempdir.rs"]
mod tempdir;

const ADMIN: &str = "props-admin-token-0123456789";

/// One server state shared by every case: a node, a running two-rank job
/// and its worker token, a node token and a submit token.
struct Fixture {
    app: App,
    job: String,
    worker: String,
    node_token: String,
    submit_token: String,
    _dir: tempdir::TempDir,
}

fn call<'a>(method: &'a str, url: &'a str, auth: Option<&'a str>, body: &'a [u8]) -> Call<'a> {
    Call {
        method,
        url,
        authorization: auth,
        host: Some("127.0.0.1:7070"),
        body,
    }
}

fn ok<T: serde::de::DeserializeOwned>(app: &App, method: &str, url: &str, body: &str) -> T {
    let auth = format!("Bearer {ADMIN}");
    let text = app
        .handle(&call(method, url, Some(&auth), body.as_bytes()))
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {url}: {e}: {text}"))
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempdir::TempDir::named("props", "api");
        let db = Db::open(&dir.path().join("s.db")).expect("open the database");
        let app = App {
            db,
            admin_token: ADMIN.into(),
            live: Liveness::new(Duration::from_secs(3600), vec![]),
            heartbeat_ms: 500,
            advertise: None,
            listen_url: "http://127.0.0.1:7070".into(),
        };
        let node = r#"{"node":"n1","rack":"r1","slots":4,"device_type":"cpu","addr":"127.0.0.1"}"#;
        let _: RegisterReply = ok(&app, "POST", "/v1/nodes/register", node);
        let req = r#"{"name":null,"workers":2,"global_batch":8,"batch_lo":1,"batch_hi":8,
                      "planner":"optperf","program":"/bin/true"}"#;
        let job = ok::<SubmitReply>(&app, "POST", "/v1/jobs", req).job_id;
        let _: HeartbeatReply = ok(&app, "POST", "/v1/nodes/n1/heartbeat", "{}");
        let hb = format!(r#"{{"stores":[{{"job_id":"{job}","addr":"127.0.0.1:5555"}}]}}"#);
        let reply: HeartbeatReply = ok(&app, "POST", "/v1/nodes/n1/heartbeat", &hb);
        let worker = reply
            .launches
            .iter()
            .flat_map(|l| l.env.iter())
            .find(|(k, _)| k == "GW_JOB_TOKEN")
            .map(|(_, v)| v.clone())
            .expect("a launch with GW_JOB_TOKEN");
        let node_token =
            ok::<IssuedToken>(&app, "POST", "/v1/tokens", r#"{"role":"node","name":"n1"}"#).token;
        let submit_token = ok::<IssuedToken>(
            &app,
            "POST",
            "/v1/tokens",
            r#"{"role":"submit","name":"ci"}"#,
        )
        .token;
        Fixture {
            app,
            job,
            worker,
            node_token,
            submit_token,
            _dir: dir,
        }
    })
}

/// Every endpoint, as (method, url) for the fixture's ids.
fn endpoints(f: &Fixture) -> Vec<(&'static str, String)> {
    let j = &f.job;
    vec![
        ("POST", "/v1/jobs".into()),
        ("GET", "/v1/jobs".into()),
        ("GET", format!("/v1/jobs/{j}")),
        ("GET", format!("/v1/jobs/{j}/events")),
        ("POST", format!("/v1/jobs/{j}/global_batch")),
        ("POST", format!("/v1/jobs/{j}/step/begin")),
        ("POST", format!("/v1/jobs/{j}/step/end")),
        ("POST", "/v1/nodes/register".into()),
        ("POST", "/v1/nodes/n1/heartbeat".into()),
        ("POST", "/v1/tokens".into()),
        ("DELETE", "/v1/tokens/node/nobody".into()),
        // Last, so the job stays running for the other cases.
        ("POST", format!("/v1/jobs/{j}-not-this-one/cancel")),
    ]
}

/// The status a request gets: 200 or the error's.
fn status(app: &App, c: &Call<'_>) -> u16 {
    match app.handle(c) {
        Ok(_) => 200,
        Err(e) => e.status,
    }
}

fn client_fault(code: u16) -> bool {
    (400..500).contains(&code)
}

/// A JSON value of any shape, a few levels deep.
fn any_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("node".to_owned()),
                    Just("rank".to_owned()),
                    Just("step".to_owned()),
                    Just("workers".to_owned()),
                    Just("role".to_owned()),
                    Just("name".to_owned()),
                    ".{0,8}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any method and path: an endpoint, 404 or 405, never a panic.
    #[test]
    fn route_parser_takes_any_path(
        method in prop_oneof![
            Just("GET".to_owned()), Just("POST".to_owned()), Just("DELETE".to_owned()), ".{0,8}"
        ],
        path in prop_oneof![
            "/v1/(jobs|nodes|tokens)(/[a-z0-9%./?#-]{0,12}){0,5}",
            ".{0,64}",
        ],
    ) {
        if let Err(e) = routes::parse(&method, &path) {
            prop_assert!(e.status == 404 || e.status == 405, "{method} {path}: {e}");
        }
    }

    /// Any Authorization header: a token or a 401.
    #[test]
    fn bearer_takes_any_header(h in ".{0,40}") {
        if let Err(e) = bearer(Some(&h)) {
            prop_assert_eq!(e.status, 401);
        }
    }

    /// Any bytes as the body of every endpoint, with a token that may call
    /// it: a 4xx (or a success, for endpoints that take no body).
    #[test]
    fn every_endpoint_takes_any_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let f = fixture();
        for (method, url) in endpoints(f) {
            for token in [ADMIN, &f.worker, &f.node_token, &f.submit_token] {
                let auth = format!("Bearer {token}");
                let code = status(&f.app, &call(method, &url, Some(&auth), &body));
                prop_assert!(code == 200 || client_fault(code), "{method} {url}: {code}");
            }
        }
    }

    /// Any JSON as the body of every endpoint.
    #[test]
    fn every_endpoint_takes_any_json(v in any_json()) {
        let f = fixture();
        let body = serde_json::to_vec(&v).expect("a value encodes");
        for (method, url) in endpoints(f) {
            let token = if url.contains("/step/") { f.worker.as_str() } else { ADMIN };
            let auth = format!("Bearer {token}");
            let code = status(&f.app, &call(method, &url, Some(&auth), &body));
            prop_assert!(code == 200 || client_fault(code), "{method} {url} {v}: {code}");
        }
    }

    /// Well-formed requests whose fields hold anything their types allow:
    /// validation answers 4xx, the handlers never fail as the server's fault.
    #[test]
    fn well_formed_requests_with_any_values(
        node in prop_oneof!["[a-z0-9._-]{1,12}", ".{0,20}"], slots in any::<u32>(),
        workers in any::<u32>(),
        b in any::<u64>(), lo in any::<u64>(), hi in any::<u64>(),
        rank in any::<u32>(), step in any::<u64>(), secs in any::<f64>(),
        role in prop_oneof![Just(Role::Node), Just(Role::Submit), Just(Role::Admin)],
    ) {
        let f = fixture();
        let j = &f.job;
        let reg = RegisterNode {
            node: node.clone(), rack: "r1".into(), slots, device_type: "cpu".into(),
            addr: "127.0.0.1".into(),
        };
        let sub = SubmitRequest {
            name: Some(node.clone()), workers, global_batch: b, batch_lo: lo, batch_hi: hi,
            schedule: vec![BatchChange { step, global_batch: b }], planner: PlannerKind::Optperf,
            program: "/bin/true".into(), args: vec![], env: vec![],
            steps: None, throughput: Vec::new(),
        };
        let end = StepEnd {
            rank, step, samples: b, compute_s: secs, comm_s: secs, step_s: secs,
            local_grad_sq: Some(secs), global_grad_sq: None,
        };
        let cases: Vec<(&str, String, String, Vec<u8>)> = vec![
            // As n1 (refused unless the name is n1's) and as the admin
            // (checked in full; a name other than n1 adds a node).
            ("POST", "/v1/nodes/register".into(), f.node_token.clone(), json(&reg)),
            ("POST", "/v1/nodes/register".into(), ADMIN.into(), json(&reg)),
            ("POST", "/v1/jobs".into(), f.submit_token.clone(), json(&sub)),
            ("POST", format!("/v1/jobs/{j}/global_batch"), ADMIN.into(),
                json(&BatchChange { step, global_batch: b })),
            ("POST", format!("/v1/jobs/{j}/step/begin"), f.worker.clone(),
                json(&StepBegin { rank, step })),
            ("POST", format!("/v1/jobs/{j}/step/end"), f.worker.clone(), json(&end)),
            ("POST", "/v1/tokens".into(), ADMIN.into(),
                json(&IssueToken { role, name: format!("x{node}") })),
        ];
        for (method, url, token, body) in cases {
            let auth = format!("Bearer {token}");
            let code = status(&f.app, &call(method, &url, Some(&auth), &body));
            prop_assert!(code == 200 || client_fault(code), "{method} {url}: {code}");
        }
    }

    /// Any path, header and body together: never a panic nor a 5xx.
    #[test]
    fn anything_at_all(
        method in ".{0,8}", url in ".{0,48}", auth in proptest::option::of(".{0,48}"),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let f = fixture();
        let c = call(&method, &url, auth.as_deref(), &body);
        if let Err(e) = f.app.admit(&c) {
            prop_assert!(client_fault(e.status), "{method} {url}: {e}");
        }
        let code = status(&f.app, &c);
        prop_assert!(code == 200 || client_fault(code), "{method} {url}: {code}");
    }
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("a request encodes")
}
