//! `gwjob submit|status|cancel` against a real server: the printed job id,
//! the status tables, cancel, and the exit statuses of mistakes.

mod server_support;

use gw_jobapi::types::*;
use server_support::*;
use std::process::{Command, Output};

fn gwjob(s: &Server, dir: &TempDir, args: &[&str]) -> Output {
    let token_file = dir.path().join("admin.token");
    let mut c = Command::new(GWJOB);
    c.arg(args[0])
        .arg("--server")
        .arg(&s.url)
        .arg("--token-file")
        .arg(&token_file)
        .args(&args[1..])
        .env_remove("GW_ADMIN_TOKEN")
        .env_remove("GW_JOB_SERVER_URL");
    c.output().expect("run gwjob")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn submit_status_cancel() {
    let dir = TempDir::new("cli");
    let s = Server::start(dir.path(), &["--node-timeout", "60"]);
    s.register("n1", "r1", 1);
    s.register("n2", "r2", 1);
    let out = gwjob(
        &s,
        &dir,
        &[
            "submit",
            "--workers",
            "2",
            "--batch-schedule",
            "16@0,24@5",
            "--batch-bounds",
            "2:20",
            "--planner",
            "optperf",
            "--name",
            "demo",
            "--env",
            "GW_ALGO=tree",
            "--",
            "/bin/echo",
            "hello",
            "--flag",
        ],
    );
    assert!(out.status.success(), "{}", err(&out));
    let id = text(&out).trim().to_owned();
    assert!(id.starts_with('j'), "{id:?}");
    let st = s.status(&id);
    assert_eq!(st.name.as_deref(), Some("demo"));
    assert_eq!((st.workers, st.global_batch), (2, 16));

    // Run two steps so the table has numbers in it.
    let l = launch(&s, &id, &["n1", "n2"]);
    let token = env(&l[0][0], "GW_JOB_TOKEN").unwrap().to_owned();
    assert_eq!(l[0][0].args, ["hello", "--flag"]);
    for step in 0..2 {
        for r in 0..2 {
            let p = s.step_begin(&id, &token, r, step).unwrap();
            assert_eq!(p.algo, "tree");
            s.step_end(
                &id,
                &token,
                &end(r, step, p.local_batch, 0.02 * (r + 1) as f64),
            )
            .unwrap();
        }
    }

    let list = gwjob(&s, &dir, &["status"]);
    assert!(list.status.success(), "{}", err(&list));
    let t = text(&list);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("JOB"), "{t}");
    assert!(
        lines[1].starts_with(&id) && lines[1].contains("running"),
        "{t}"
    );

    let one = gwjob(&s, &dir, &["status", &id]);
    assert!(one.status.success(), "{}", err(&one));
    let t = text(&one);
    assert!(t.contains(&format!("job {id} (demo): running")), "{t}");
    assert!(t.contains("global batch 16, last completed step 1"), "{t}");
    assert!(t.contains("step time: predicted"), "{t}");
    assert!(t.contains("measured 50.00 ms"), "{t}");
    let head = t.lines().position(|l| l.starts_with("RANK")).expect(&t);
    let rows: Vec<Vec<&str>> = t
        .lines()
        .skip(head + 1)
        .take(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(&rows[0][..3], ["0", "n1", "8"], "{t}");
    assert_eq!(&rows[1][..3], ["1", "n2", "8"], "{t}");
    assert!(t.contains("recent events:"), "{t}");

    let json = gwjob(&s, &dir, &["status", &id, "--json"]);
    let parsed: JobStatus = serde_json::from_slice(&json.stdout).expect("status --json");
    assert_eq!(parsed.job_id, id);

    let c = gwjob(&s, &dir, &["cancel", &id]);
    assert!(c.status.success(), "{}", err(&c));
    assert_eq!(text(&c), format!("job {id} cancelled\n"));
    assert_eq!(s.status(&id).state, JobState::Cancelled);

    // The environment works as well as the flags.
    let out = Command::new(GWJOB)
        .args(["status", &id])
        .env("GW_JOB_SERVER_URL", &s.url)
        .env("GW_ADMIN_TOKEN", &s.token)
        .output()
        .unwrap();
    assert!(text(&out).contains("cancelled"), "{}", err(&out));
}

#[test]
fn mistakes_exit_nonzero_with_a_message() {
    let dir = TempDir::new("cli-err");
    let s = Server::start(dir.path(), &[]);
    // Refused by the server: exit 1, its message shown.
    let o = gwjob(
        &s,
        &dir,
        &["submit", "--workers", "0", "--global-batch", "8", "--", "p"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("workers must be at least 1"),
        "{}",
        err(&o)
    );
    let o = gwjob(&s, &dir, &["cancel", "j99-nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("404"), "{}", err(&o));
    // Usage errors: exit 2, nothing sent.
    let o = gwjob(&s, &dir, &["submit", "--workers", "2", "--", "p"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--global-batch"), "{}", err(&o));
    let o = gwjob(
        &s,
        &dir,
        &[
            "submit",
            "--workers",
            "2",
            "--global-batch",
            "4",
            "--planner",
            "fast",
            "p",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    let jobs: Vec<JobStatus> = s.get("/v1/jobs");
    assert!(jobs.is_empty());
    // Wrong token: 401.
    let bad = dir.path().join("bad.token");
    std::fs::write(&bad, "nope\n").unwrap();
    let o = Command::new(GWJOB)
        .args(["status", "--server", &s.url, "--token-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("401"), "{}", err(&o));
    // No token at all.
    let o = Command::new(GWJOB)
        .args(["status", "--server", &s.url])
        .env_remove("GW_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("no token"), "{}", err(&o));
    // No server there.
    let o = Command::new(GWJOB)
        .args(["status", "--server", "http://127.0.0.1:1"])
        .env("GW_ADMIN_TOKEN", "x")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    // Help and unknown commands.
    for (args, code) in [
        (&["--help"][..], 0),
        (&["serve", "--help"][..], 0),
        (&["submit", "--help"][..], 0),
        (&["frobnicate"][..], 2),
        (&[][..], 2),
        (&["serve"][..], 2),
    ] {
        let o = Command::new(GWJOB).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", err(&o));
    }
}
