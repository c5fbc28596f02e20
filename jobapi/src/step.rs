//! The worker's side of the step protocol: before each step ask the job
//! server for the plan (local batch, gradient weight, algorithm), after it
//! report what the step cost.
//!
//! Two calls per step, each one small JSON message, so the server sees every
//! rank's compute time without carrying any gradient bytes. The server must
//! be allowed to die and come back (`kill -9`, restart on the same database)
//! without the job losing or repeating a step, which is why:
//! - the *client* owns the step counter: it asks for "step N" explicitly, and
//!   both calls are idempotent per (rank, step) on the server, so a call whose
//!   reply was lost is simply sent again;
//! - transient failures (connection refused or reset, timeouts, 5xx) are
//!   retried with exponential backoff and jitter for a bounded time
//!   (`GW_JOB_RETRY_S`, 60 s by default), after which the worker gives up
//!   with an error naming the server rather than hanging forever;
//! - a job the server has ended (409 with the documented `job J failed: ...`,
//!   `job J was cancelled: ...` or `job J has already succeeded`, or 410) is
//!   reported as [`StepError::Stopped`] with the server's reason; other 4xx
//!   answers (a step out of order, a bad rank) are returned at once as
//!   [`StepError::Rejected`]: retrying a refusal cannot help.

use crate::http::{Client, HttpError};
use crate::types::{StepBegin, StepEnd, StepEndReply, StepPlan};
use gw_rendezvous::launch_env::{JobServerEnv, var};
use std::time::{Duration, Instant};

/// Default of `GW_JOB_RETRY_S`: how long a server may stay unreachable.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(60);
/// First pause between retries; doubled after every failure...
pub const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// ...up to this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Limit of one HTTP exchange. The server answers step calls at once, so a
/// call this slow is treated like a broken connection and retried.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a worker measured in the step it ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Samples computed (normally the plan's local batch).
    pub samples: u64,
    /// Seconds spent computing.
    pub compute_s: f64,
    /// Seconds spent in the gradient all-reduce that did not overlap compute.
    pub comm_s: f64,
    /// Wall time of the whole step on this rank, seconds.
    pub step_s: f64,
    /// |g_i|² of this rank's local mean gradient (for the noise scale).
    pub local_grad_sq: Option<f64>,
    /// |g|² of the all-reduced gradient.
    pub global_grad_sq: Option<f64>,
}

/// Why a step call failed.
#[derive(Debug)]
pub enum StepError {
    /// A `GW_*` variable the step client needs is missing or malformed.
    Env { var: &'static str, detail: String },
    /// The server stayed unreachable (or kept answering 5xx) for the whole
    /// retry budget.
    ServerGone {
        server: String,
        waited: Duration,
        last: HttpError,
    },
    /// The job is over (cancelled, or failed elsewhere): the worker should exit.
    Stopped { job_id: String, reason: String },
    /// The server refused the call (4xx): not retried.
    Rejected(HttpError),
    /// The reply did not fit the request (another step's plan).
    Protocol(String),
    /// `end` without a step begun.
    NotBegun { next: u64 },
    /// The scheduler preempts the job at `step`: the worker must not run
    /// it, but save its state through step `step - 1` and exit 0. The job
    /// resumes from `step` wherever the policy places it next, and its
    /// workers are started with `GW_RESUME_STEP` set to it. An error rather
    /// than a plan, so a worker that does not handle it fails loudly instead
    /// of training on an empty batch.
    Preempted { job_id: String, step: u64 },
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::Env { var, detail } => write!(f, "{var}: {detail}"),
            StepError::ServerGone {
                server,
                waited,
                last,
            } => {
                let s = waited.as_secs_f64();
                let s = if s < 10.0 {
                    format!("{s:.1}")
                } else {
                    format!("{s:.0}")
                };
                write!(f, "job server {server} gone for {s} s (last error: {last})")
            }
            StepError::Stopped { job_id, reason } => {
                write!(f, "job {job_id} stopped: {reason}")
            }
            StepError::Rejected(e) => write!(f, "job server refused the step call: {e}"),
            StepError::Protocol(m) => write!(f, "step protocol error: {m}"),
            StepError::NotBegun { next } => write!(
                f,
                "step end without step begin (the next step is {next}; call begin first)"
            ),
            StepError::Preempted { job_id, step } => write!(
                f,
                "job {job_id} is preempted at step {step}: save a checkpoint of everything \
                 through step {} and exit 0; the job resumes from step {step}",
                step.saturating_sub(1)
            ),
        }
    }
}

impl std::error::Error for StepError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StepError::ServerGone { last, .. } => Some(last),
            StepError::Rejected(e) => Some(e),
            _ => None,
        }
    }
}

/// A rank's connection to the job server's step protocol.
#[derive(Debug)]
pub struct StepClient {
    server: String,
    job_id: String,
    token: String,
    rank: u32,
    /// The step the next `begin` asks for.
    next: u64,
    /// The step begun and not yet ended.
    open: Option<u64>,
    retry: Duration,
    backoff_first: Duration,
    backoff_max: Duration,
    call_timeout: Duration,
    /// Kept across calls, so a step costs no new connection.
    http: Client,
    rng: u64,
}

/// Parses `GW_JOB_RETRY_S`: seconds, fractions allowed, > 0.
pub use gw_rendezvous::launch_env::parse_retry;

impl StepClient {
    /// The client for this worker, from the variables a gwjob agent sets:
    /// `GW_JOB_SERVER`, `GW_JOB_ID`, `GW_JOB_TOKEN`, `GW_RANK`, and optionally
    /// `GW_JOB_RETRY_S`. `None` when `GW_JOB_SERVER` is unset or empty (the
    /// program was not started by a gwjob agent).
    pub fn from_env() -> Result<Option<StepClient>, StepError> {
        if !server_in_env() {
            return Ok(None);
        }
        let text = std::env::var(var::RANK).unwrap_or_default();
        let rank = text.trim().parse::<u32>().map_err(|_| StepError::Env {
            var: var::RANK,
            detail: if text.trim().is_empty() {
                format!(
                    "is not set ({} is, so a gwjob agent should have set it)",
                    var::JOB_SERVER
                )
            } else {
                format!("'{text}' is not a rank number")
            },
        })?;
        Self::from_env_with_rank(rank)
    }

    /// As [`StepClient::from_env`], but for `rank` rather than `GW_RANK`
    /// (for callers that know their rank from a communicator). A worker
    /// started to resume a preempted job (`GW_RESUME_STEP`) counts from
    /// that step.
    pub fn from_env_with_rank(rank: u32) -> Result<Option<StepClient>, StepError> {
        let found = JobServerEnv::from_env().map_err(|e| StepError::Env {
            var: e.var,
            detail: e.detail,
        })?;
        let Some((server, job_id)) = found else {
            return Ok(None);
        };
        let mut c = StepClient::new(&server.url, &job_id, &server.job_token, rank);
        if let Some(d) = server.retry {
            c = c.with_retry(d);
        }
        if let Some(step) = resume_step_from_env()? {
            c = c.resume_at(step);
        }
        Ok(Some(c))
    }

    /// A client of job `job_id` on `server` (`http://host:port`) for `rank`,
    /// authenticated by the job's `token`.
    pub fn new(server: &str, job_id: &str, token: &str, rank: u32) -> StepClient {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (u64::from(std::process::id()) << 32)
            ^ u64::from(rank).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        StepClient {
            server: server.trim_end_matches('/').to_owned(),
            job_id: job_id.to_owned(),
            token: token.to_owned(),
            rank,
            next: 0,
            open: None,
            retry: DEFAULT_RETRY,
            backoff_first: BACKOFF_FIRST,
            backoff_max: BACKOFF_MAX,
            call_timeout: CALL_TIMEOUT,
            http: Client::new(CALL_TIMEOUT),
            rng: seed | 1,
        }
    }

    /// How long to keep retrying a server that is down or answering 5xx.
    pub fn with_retry(mut self, total: Duration) -> StepClient {
        self.retry = total;
        self
    }

    /// The pauses between retries: `first`, doubling up to `max`.
    pub fn with_backoff(mut self, first: Duration, max: Duration) -> StepClient {
        self.backoff_first = first;
        self.backoff_max = max.max(first);
        self
    }

    /// Limit of one HTTP exchange (a slower one is retried).
    pub fn with_call_timeout(mut self, t: Duration) -> StepClient {
        self.call_timeout = t;
        self.http = Client::new(t);
        self
    }

    /// Starts counting at `step` instead of 0 (a worker resuming a job).
    pub fn resume_at(mut self, step: u64) -> StepClient {
        self.next = step;
        self.open = None;
        self
    }

    /// The number of the next step `begin` asks for (the open one, if a step
    /// was begun and not ended).
    pub fn step(&self) -> u64 {
        self.open.unwrap_or(self.next)
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The plan of the next step. Calling it again before [`StepClient::end`]
    /// asks for the same step again (the server returns the same plan).
    pub fn begin(&mut self) -> Result<StepPlan, StepError> {
        let step = self.step();
        let path = format!("/v1/jobs/{}/step/begin", self.job_id);
        let body = StepBegin {
            rank: self.rank,
            step,
        };
        let plan: StepPlan = self.call_retrying(&path, &body)?;
        if plan.step != step {
            return Err(StepError::Protocol(format!(
                "rank {} asked for the plan of step {step} and got step {}",
                self.rank, plan.step
            )));
        }
        if plan.checkpoint {
            return Err(StepError::Preempted {
                job_id: self.job_id.clone(),
                step,
            });
        }
        self.open = Some(step);
        Ok(plan)
    }

    /// Reports the step begun last and moves on to the next one. Safe to
    /// retry (the server records each (rank, step) once). The reply says
    /// whether the server wants this worker to stop.
    pub fn end(&mut self, report: &StepReport) -> Result<StepEndReply, StepError> {
        let Some(step) = self.open else {
            return Err(StepError::NotBegun { next: self.next });
        };
        let path = format!("/v1/jobs/{}/step/end", self.job_id);
        let body = StepEnd {
            rank: self.rank,
            step,
            samples: report.samples,
            compute_s: report.compute_s,
            comm_s: report.comm_s,
            step_s: report.step_s,
            local_grad_sq: report.local_grad_sq.filter(|v| v.is_finite()),
            global_grad_sq: report.global_grad_sq.filter(|v| v.is_finite()),
        };
        let reply: StepEndReply = self.call_retrying(&path, &body)?;
        self.open = None;
        self.next = step + 1;
        Ok(reply)
    }

    /// One POST, retried while the failure is transient and the budget lasts.
    fn call_retrying<B: serde::Serialize, R: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
    ) -> Result<R, StepError> {
        let start = Instant::now();
        let mut pause = self.backoff_first;
        loop {
            let err =
                match self
                    .http
                    .call::<B, R>("POST", &self.server, path, &self.token, Some(body))
                {
                    Ok(r) => return Ok(r),
                    Err(e) => e,
                };
            if let Some(reason) = stopped_reason(&self.job_id, &err) {
                return Err(StepError::Stopped {
                    job_id: self.job_id.clone(),
                    reason,
                });
            }
            if !err.is_transient() {
                return Err(StepError::Rejected(err));
            }
            let waited = start.elapsed();
            let Some(left) = self.retry.checked_sub(waited).filter(|l| !l.is_zero()) else {
                return Err(StepError::ServerGone {
                    server: self.server.clone(),
                    waited,
                    last: err,
                });
            };
            std::thread::sleep(self.jitter(pause).min(left));
            pause = (pause * 2).min(self.backoff_max);
        }
    }

    /// `d` scaled by a random factor in [0.5, 1): ranks that lost the same
    /// server do not all come back in the same millisecond.
    fn jitter(&mut self, d: Duration) -> Duration {
        // xorshift64: no dependency, and quality does not matter here.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let frac = 0.5 + (x >> 11) as f64 / (1u64 << 53) as f64 * 0.5;
        d.mul_f64(frac)
    }
}

/// `GW_RESUME_STEP`: the step a resumed worker starts from (None when unset
/// or empty: a fresh start).
pub fn resume_step_from_env() -> Result<Option<u64>, StepError> {
    parse_resume_step(std::env::var(var::RESUME_STEP).ok().as_deref())
}

fn parse_resume_step(text: Option<&str>) -> Result<Option<u64>, StepError> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => t.parse::<u64>().map(Some).map_err(|_| StepError::Env {
            var: var::RESUME_STEP,
            detail: format!("'{t}' is not a step number"),
        }),
    }
}

/// The reason when `e` says the job is over: 410, or 409 with one of the
/// messages docs/jobserver.md lists for a job that is not running.
fn stopped_reason(job_id: &str, e: &HttpError) -> Option<String> {
    let HttpError::Status {
        status, message, ..
    } = e
    else {
        return None;
    };
    let rest = message.strip_prefix(&format!("job {job_id} "));
    match (*status, rest) {
        (410, Some(r)) => Some(r.to_owned()),
        (410, None) => Some(message.clone()),
        (409, Some(r))
            if r.starts_with("failed")
                || r.starts_with("was cancelled")
                || r.starts_with("has already succeeded") =>
        {
            Some(r.to_owned())
        }
        _ => None,
    }
}

fn server_in_env() -> bool {
    std::env::var_os(var::JOB_SERVER).is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{SocketAddr, TcpListener};
    use std::thread::JoinHandle;

    /// Answers one request per `(status, body)` on `listener`, in order, and
    /// returns the (path, body) of each request it read.
    fn serve(
        listener: TcpListener,
        answers: Vec<(u16, String)>,
    ) -> JoinHandle<Vec<(String, String)>> {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            for (status, body) in answers {
                let Ok((mut s, _)) = listener.accept() else {
                    break;
                };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).unwrap();
                    if h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut req = vec![0; len];
                r.read_exact(&mut req).unwrap();
                seen.push((path, String::from_utf8(req).unwrap()));
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(reply.as_bytes()).unwrap();
            }
            seen
        })
    }

    /// Answers `n` requests, all on the first connection (keep-alive), and
    /// returns how many further connections were attempted meanwhile.
    fn serve_kept(
        listener: TcpListener,
        n: usize,
        body: impl Fn(usize) -> String + Send + 'static,
    ) -> JoinHandle<usize> {
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            for i in 0..n {
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap() == 0 {
                        return usize::MAX;
                    }
                    if h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        len = v.trim().parse().unwrap();
                    }
                }
                let mut req = vec![0; len];
                r.read_exact(&mut req).unwrap();
                let b = body(i);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                );
                w.write_all(reply.as_bytes()).unwrap();
            }
            listener.set_nonblocking(true).unwrap();
            let mut more = 0;
            while listener.accept().is_ok() {
                more += 1;
            }
            more
        })
    }

    #[test]
    fn every_call_of_a_rank_goes_over_one_kept_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = serve_kept(l, 10, |i| {
            if i % 2 == 0 {
                plan(i as u64 / 2)
            } else {
                String::from(r#"{"stop":false}"#)
            }
        });
        // A second connection would never be answered: give up soon.
        let mut c = client(addr)
            .with_retry(Duration::from_secs(1))
            .with_call_timeout(Duration::from_secs(1));
        for step in 0..5 {
            assert_eq!(c.begin().unwrap().step, step);
            c.end(&StepReport {
                samples: 16,
                compute_s: 0.1,
                comm_s: 0.01,
                step_s: 0.11,
                local_grad_sq: None,
                global_grad_sq: None,
            })
            .unwrap();
        }
        assert_eq!(
            server.join().unwrap(),
            0,
            "a call opened a second connection"
        );
    }

    fn plan(step: u64) -> String {
        format!(
            r#"{{"step":{step},"global_batch":64,"local_batch":16,"offset":32,"weight":0.25,"algo":"ring","predicted_step_s":null}}"#
        )
    }

    fn err(msg: &str) -> String {
        format!(r#"{{"error":"{msg}"}}"#)
    }

    fn client(addr: SocketAddr) -> StepClient {
        StepClient::new(&format!("http://{addr}/"), "j1", "tok", 2)
            .with_backoff(Duration::from_millis(20), Duration::from_millis(100))
            .with_call_timeout(Duration::from_secs(5))
    }

    fn free_port() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    #[test]
    fn refused_then_503_then_200_is_retried_through() {
        let addr = free_port(); // closed: the first tries are refused
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let l = TcpListener::bind(addr).unwrap();
            serve(l, vec![(503, err("restarting")), (200, plan(0))])
                .join()
                .unwrap()
        });
        let mut c = client(addr).with_retry(Duration::from_secs(10));
        let t = Instant::now();
        let p = c.begin().unwrap();
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!((p.step, p.local_batch, p.offset), (0, 16, 32));
        assert_eq!(p.weight, 0.25);
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1].0, "/v1/jobs/j1/step/begin");
        let b: StepBegin = serde_json::from_str(&seen[1].1).unwrap();
        assert_eq!(b, StepBegin { rank: 2, step: 0 });
    }

    #[test]
    fn a_server_that_stays_down_is_given_up_after_the_budget() {
        let addr = free_port();
        let mut c = client(addr).with_retry(Duration::from_millis(400));
        let t = Instant::now();
        let e = c.begin().unwrap_err();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(matches!(e, StepError::ServerGone { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("job server http://{addr} gone for 0.")),
            "{msg}"
        );
        assert_eq!(c.step(), 0, "a failed begin opens no step");
    }

    #[test]
    fn client_errors_are_not_retried_and_stopped_jobs_say_why() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = serve(
            l,
            vec![
                (400, err("rank 9 is not in this job")),
                (409, err("step 7 of job j1 is ahead of the job")),
                (
                    409,
                    err("job j1 failed: rank 1 on node b exited with status 3"),
                ),
                (410, err("job j1 was cancelled: by alice")),
            ],
        );
        let mut c = client(addr).with_retry(Duration::from_secs(30));
        let t = Instant::now();
        let e = c.begin().unwrap_err();
        assert!(
            matches!(
                e,
                StepError::Rejected(HttpError::Status { status: 400, .. })
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("rank 9 is not in this job"), "{e}");
        let e = c.begin().unwrap_err();
        assert!(
            matches!(
                e,
                StepError::Rejected(HttpError::Status { status: 409, .. })
            ),
            "{e:?}"
        );
        let e = c.begin().unwrap_err();
        assert_eq!(
            e.to_string(),
            "job j1 stopped: failed: rank 1 on node b exited with status 3"
        );
        let e = c.begin().unwrap_err();
        assert_eq!(e.to_string(), "job j1 stopped: was cancelled: by alice");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "4xx must not be retried"
        );
        assert_eq!(srv.join().unwrap().len(), 4);
    }

    #[test]
    fn steps_are_counted_by_the_client_and_end_is_reported_for_the_open_step() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = serve(
            l,
            vec![
                (200, plan(5)),
                (200, plan(5)), // begin again before end: the same step
                (502, err("bad gateway")),
                (200, r#"{"stop":false}"#.into()),
                (200, plan(6)),
                (200, r#"{"stop":true}"#.into()),
                (200, plan(9)), // a plan for another step than asked
            ],
        );
        let mut c = client(addr).resume_at(5);
        assert!(matches!(
            c.end(&StepReport::default()),
            Err(StepError::NotBegun { next: 5 })
        ));
        assert_eq!(c.begin().unwrap().step, 5);
        assert_eq!(c.begin().unwrap().step, 5);
        assert_eq!(c.step(), 5);
        let rep = StepReport {
            samples: 16,
            compute_s: 0.5,
            comm_s: 0.1,
            step_s: 0.7,
            local_grad_sq: Some(2.0),
            global_grad_sq: Some(f64::NAN),
        };
        assert!(!c.end(&rep).unwrap().stop);
        assert_eq!(c.step(), 6);
        assert_eq!(c.begin().unwrap().step, 6);
        assert!(c.end(&rep).unwrap().stop);
        let e = c.begin().unwrap_err();
        assert!(matches!(e, StepError::Protocol(_)), "{e:?}");
        assert_eq!(c.step(), 7);
        let seen = srv.join().unwrap();
        assert_eq!(seen[3].0, "/v1/jobs/j1/step/end");
        let end: StepEnd = serde_json::from_str(&seen[3].1).unwrap();
        assert_eq!((end.rank, end.step, end.samples), (2, 5, 16));
        assert_eq!(end.local_grad_sq, Some(2.0));
        assert_eq!(end.global_grad_sq, None, "NaN is sent as null");
        // The retried end (after the 502) sent the same body again.
        assert_eq!(seen[2].1, seen[3].1);
    }

    #[test]
    fn retry_budget_parses_seconds() {
        assert_eq!(parse_retry("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_retry(" 0.5 "), Ok(Duration::from_millis(500)));
        assert!(parse_retry("0").is_err());
        assert!(parse_retry("-3").is_err());
        assert!(parse_retry("soon").is_err());
        assert!(parse_retry("inf").is_err());
    }

    #[test]
    fn jitter_stays_between_half_and_full() {
        let mut c = StepClient::new("http://x", "j", "t", 0);
        for _ in 0..1000 {
            let d = c.jitter(Duration::from_millis(100));
            assert!(
                d >= Duration::from_millis(50) && d <= Duration::from_millis(100),
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_checkpoint_plan_is_a_preemption_and_opens_no_step() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = serve(
            l,
            vec![(
                200,
                r#"{"step":12,"global_batch":64,"local_batch":0,"offset":0,"weight":0.0,"algo":"auto","predicted_step_s":null,"checkpoint":true}"#.into(),
            )],
        );
        let mut c = client(addr).resume_at(12);
        let e = c.begin().unwrap_err();
        assert!(
            matches!(&e, StepError::Preempted { job_id, step: 12 } if job_id == "j1"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "job j1 is preempted at step 12: save a checkpoint of everything through \
             step 11 and exit 0; the job resumes from step 12"
        );
        assert!(matches!(
            c.end(&StepReport::default()),
            Err(StepError::NotBegun { next: 12 })
        ));
        assert_eq!(srv.join().unwrap().len(), 1);
    }

    #[test]
    fn resume_step_is_a_step_number_or_absent() {
        assert_eq!(parse_resume_step(None).unwrap(), None);
        assert_eq!(parse_resume_step(Some(" ")).unwrap(), None);
        assert_eq!(parse_resume_step(Some("0")).unwrap(), Some(0));
        assert_eq!(parse_resume_step(Some(" 41 ")).unwrap(), Some(41));
        for bad in ["-1", "x", "1.5"] {
            let e = parse_resume_step(Some(bad)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("GW_RESUME_STEP: '{bad}' is not a step number")
            );
        }
    }
}
