//! `gwjob serve`: the job server. It exists so that a data-parallel job
//! outlives any one process: nodes register with it, it places jobs on
//! them, tells their agents what to start and stop, and runs the per-step
//! protocol through which workers get their (OptPerf-planned) local batch
//! and report their timings. Everything it knows is in SQLite (`db.rs`), so
//! a `kill -9` and restart on the same database loses nothing.
//!
//! Layout: `args` (command line), `http` (hyper on tokio, with every limit)
//! → `app` (routing, auth, one transaction per request; `access` says which
//! token may call what, `credentials` keeps the issued node and submit
//! tokens) → `jobs`, `nodes`, `steps` (the handlers) → `plan` and
//! `placement` (pure policy) and `db`. With `--policy`, `rounds` runs a
//! `gw_scheduler` policy at every round boundary and preempts jobs through
//! checkpoints in the step protocol.

pub mod access;
pub mod app;
pub mod args;
pub mod auth;
pub mod credentials;
pub mod db;
pub mod error;
pub mod http;
pub mod jobs;
pub mod nodes;
pub mod placement;
pub mod plan;
pub mod profile;
pub mod rounds;
pub mod routes;
pub mod status;
pub mod steps;
pub mod store;
pub mod validate;

use app::App;
use args::ServeOptions;
use auth::TokenSource;
use db::Db;
use nodes::Liveness;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// `gwjob serve`, with options already checked: returns only on an error
/// (the server runs until killed), which `gwjob` prints as
/// `gwjob serve: error: ...` and exits 1 for.
pub fn main(o: ServeOptions) -> Result<(), String> {
    run(o)
}

fn run(o: ServeOptions) -> Result<(), String> {
    let db = Db::open(&o.db)?;
    let env_token = std::env::var("GW_ADMIN_TOKEN").ok();
    let (admin_token, source) = auth::admin_token(o.token_file.as_deref(), env_token, &o.db)?;
    match &source {
        TokenSource::File(p) => println!("gwjob: admin token from {}", p.display()),
        TokenSource::Env => println!("gwjob: admin token from GW_ADMIN_TOKEN"),
        TokenSource::Generated(p) => println!("gwjob: admin token in {}", p.display()),
    }
    let up = db.tx(nodes::up_nodes).map_err(|e| e.message)?;
    db.tx(|tx| {
        rounds::set_policy_name(tx, o.policy.as_ref().map(|p| p.name.as_str()))?;
        profile::set_steps(tx, o.policy.as_ref().map_or(0, |p| p.profile_steps))
    })
    .map_err(|e| e.message)?;
    let live = Liveness::new(o.node_timeout, up);
    let listener = std::net::TcpListener::bind(o.listen.as_str())
        .map_err(|e| format!("cannot listen on {}: {e}", o.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the address of {}: {e}", o.listen))?;
    let listen_url = format!("http://{addr}");
    let app = Arc::new(App {
        db,
        admin_token,
        live,
        heartbeat_ms: o.heartbeat_ms,
        advertise: o.advertise,
        listen_url: listen_url.clone(),
    });
    start_liveness(app.clone())?;
    if let Some(p) = o.policy {
        println!(
            "gwjob: scheduling with the {} policy, rounds of {} s",
            p.name,
            p.round.as_secs_f64()
        );
        start_rounds(app.clone(), p)?;
    }
    println!("gwjob: listening on {listen_url}");
    let _ = std::io::stdout().flush();
    http::serve(app, listener, o.threads, o.limits)
}

/// The thread that runs the scheduling policy at every round boundary.
fn start_rounds(app: Arc<App>, p: args::PolicyOptions) -> Result<(), String> {
    let policy = rounds::live_policy(&p.name)?;
    let mut rounds = rounds::Rounds::new(policy, p.round.as_secs_f64());
    std::thread::Builder::new()
        .name("gwjob-rounds".into())
        .spawn(move || {
            loop {
                std::thread::sleep(p.round);
                if let Err(e) = app.db.tx(|tx| rounds.run(tx)) {
                    tracing::error!("scheduling round failed: {e}");
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the scheduling thread: {e}"))
}

/// The thread that marks silent nodes lost, checking several times per
/// timeout so a loss is noticed within ~10% of it.
fn start_liveness(app: Arc<App>) -> Result<(), String> {
    let period = (app.live.timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
    std::thread::Builder::new()
        .name("gwjob-liveness".into())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                if let Err(e) = app.check_nodes() {
                    tracing::error!("node liveness check failed: {e}");
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the liveness thread: {e}"))
}
