//! The job server's HTTP/JSON messages, in one place so the server, the
//! agents, the `gwjob` client and the workers (Rust, C ABI, Python) cannot
//! drift apart. `docs/jobserver.md` documents each endpoint with these bodies.
//!
//! Every request carries `Authorization: Bearer TOKEN`: a submit token (or
//! the admin token) for submit/status/cancel, a node's own token (or the
//! admin token) for its agent, a job's own token for its workers, and the
//! admin token alone to issue and revoke tokens ([`Role`]).
//! Errors come back as a non-2xx status with an [`ErrorBody`].

use serde::{Deserialize, Serialize};

/// Body of every non-2xx reply.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: String,
}

/// How local batches are chosen.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PlannerKind {
    /// Equal shares (remainder to the lowest ranks).
    Even,
    /// Heterogeneity-aware shares that make all ranks finish together.
    Optperf,
}

/// A change of the global batch from a given step on (adaptive batch size).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BatchChange {
    pub step: u64,
    pub global_batch: u64,
}

/// `POST /v1/jobs` (submit or admin token).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SubmitRequest {
    pub name: Option<String>,
    pub workers: u32,
    /// Global batch at step 0; `schedule` may change it later.
    pub global_batch: u64,
    /// Inclusive bounds on every local batch.
    pub batch_lo: u64,
    pub batch_hi: u64,
    /// Later global batches, ordered by step (step > 0).
    #[serde(default)]
    pub schedule: Vec<BatchChange>,
    pub planner: PlannerKind,
    /// Program and arguments, run by the agents on each worker slot.
    pub program: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment for the workers (`GW_*` tuning, the program's own).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Steps the job runs in all. A server with a scheduling policy
    /// (`gwjob serve --policy`) needs it to know how much work is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// The job's speed on each device type it may use (Hadar's T[j][k],
    /// steps/s with all workers on that type). Empty: the same speed
    /// everywhere. A type not listed is one the job cannot run on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throughput: Vec<DeviceThroughput>,
}

/// A job's speed on one device type.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceThroughput {
    pub device_type: String,
    pub steps_per_s: f64,
}

/// The service a job has had on one device type under a scheduling policy:
/// round-seconds of its placement, each weighted by its share of the job's
/// workers on that type (what Gavel and Hadar call attained service).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceService {
    pub device_type: String,
    pub seconds: f64,
}

/// Reply to a submit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SubmitReply {
    pub job_id: String,
}

/// `POST /v1/jobs/{id}/global_batch` (submit or admin token): set B from
/// `step` on.
pub type SetGlobalBatch = BatchChange;

/// Lifecycle of a job.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Accepted, waiting for slots.
    Pending,
    /// Placed; agents are starting or running its workers.
    Running,
    /// Every worker exited 0.
    Succeeded,
    /// A worker or node failed; `reason` says which.
    Failed,
    Cancelled,
}

/// One rank of a job, as `GET /v1/jobs/{id}` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RankStatus {
    pub rank: u32,
    pub node: String,
    /// Local batch in the current plan.
    pub local_batch: u64,
    /// Fitted compute time t(b) = a·b + c, seconds (None before enough reports).
    pub fit_a: Option<f64>,
    pub fit_c: Option<f64>,
    /// Last reported compute time, seconds.
    pub last_compute_s: Option<f64>,
    /// Exit status once the worker ended (negative: killed by that signal).
    pub exit: Option<i32>,
}

/// `GET /v1/jobs/{id}` (submit or admin token); `GET /v1/jobs` returns a
/// list of these.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobStatus {
    pub job_id: String,
    pub name: Option<String>,
    pub state: JobState,
    pub reason: Option<String>,
    pub workers: u32,
    pub planner: PlannerKind,
    pub global_batch: u64,
    /// Highest step every rank has ended.
    pub step: Option<u64>,
    /// Planner's predicted step time for the current plan, seconds.
    pub predicted_step_s: Option<f64>,
    /// Measured step time of the last completed step (slowest rank), seconds.
    pub measured_step_s: Option<f64>,
    /// Gradient noise scale estimate, when workers report gradient norms.
    pub noise_scale: Option<f64>,
    pub ranks: Vec<RankStatus>,
    /// Which placement of the job this is: 0 the first, one more after
    /// each preemption by the scheduling policy.
    #[serde(default)]
    pub attempt: u32,
    /// The step its current placement started from (0 unless it resumed
    /// from a checkpoint).
    #[serde(default)]
    pub resume_step: u64,
    /// True while its workers are being asked to checkpoint and exit.
    #[serde(default)]
    pub preempting: bool,
    /// Its speed per device type as profiled by the server (a job submitted
    /// under a scheduling policy without `throughput`), by type name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured_throughput: Vec<DeviceThroughput>,
    /// The service it has had per device type, as the scheduling policy
    /// counts it (kept across server restarts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service: Vec<DeviceService>,
    /// Set when part of the job's stored state cannot be read: the fields
    /// that depend on it are left empty, and only this job is affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/nodes/register` (the node's own token, or the admin token).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegisterNode {
    pub node: String,
    pub rack: String,
    pub slots: u32,
    pub device_type: String,
    /// Address other nodes' workers reach this node on (the rendezvous store
    /// for a job whose rank 0 runs here binds it).
    pub addr: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegisterReply {
    /// How often the agent must heartbeat, milliseconds.
    pub heartbeat_ms: u64,
    /// The rights of the token the agent registered with, so an agent
    /// running with the admin token can say so (absent from servers that
    /// predate per-node tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// What a token may do. The admin token does everything; a submit token
/// submits, reads and cancels jobs; a node token acts only as its own node
/// (register and heartbeat). Workers' job tokens are not roles: they sign
/// only their own job's step protocol.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Submit,
    Node,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Submit => "submit",
            Role::Node => "node",
        }
    }
}

/// `POST /v1/tokens` (admin): issue a token of `role` (node or submit)
/// named `name` (for a node token, the node's name). Issuing again for the
/// same role and name replaces the old token, which stops working.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IssueToken {
    pub role: Role,
    pub name: String,
}

/// Reply to [`IssueToken`]: the only time the server shows the token (it
/// keeps only a hash).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IssuedToken {
    pub role: Role,
    pub name: String,
    pub token: String,
}

/// Reply to `DELETE /v1/tokens/{role}/{name}` (admin): the token revoked.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RevokedToken {
    pub role: Role,
    pub name: String,
}

/// `POST /v1/nodes/{node}/heartbeat` (that node's token, or the admin
/// token). Also carries the agent's
/// news: store addresses it opened and workers that ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Heartbeat {
    /// Rendezvous stores this agent started since the last heartbeat.
    #[serde(default)]
    pub stores: Vec<StoreOpened>,
    /// Workers that ended since the last heartbeat. Re-sent until a reply
    /// arrives, so the server must accept duplicates.
    #[serde(default)]
    pub exits: Vec<WorkerExit>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StoreOpened {
    pub job_id: String,
    /// The placement ([`Launch::attempt`]) the store serves.
    #[serde(default)]
    pub attempt: u32,
    /// `host:port` the job's workers use as `GW_STORE`.
    pub addr: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WorkerExit {
    pub job_id: String,
    /// The placement ([`Launch::attempt`]) the worker belonged to.
    #[serde(default)]
    pub attempt: u32,
    pub rank: u32,
    /// Exit code, or None when killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// What the server wants this node to do now.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HeartbeatReply {
    /// Jobs whose rendezvous store this node must open (it holds rank 0).
    #[serde(default)]
    pub open_stores: Vec<OpenStore>,
    /// Workers to start (only once the job's store address is known).
    #[serde(default)]
    pub launches: Vec<Launch>,
    /// Jobs whose workers on this node must be stopped (cancelled or failed).
    #[serde(default)]
    pub stops: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OpenStore {
    pub job_id: String,
    /// The placement ([`Launch::attempt`]) the store is for: a preempted
    /// job's next placement gets a new store.
    #[serde(default)]
    pub attempt: u32,
    /// Token the store requires (`GW_TOKEN`).
    pub store_token: String,
}

/// Start these ranks of a job on this node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Launch {
    pub job_id: String,
    /// Which placement of the job this is (0 first; one more after each
    /// preemption): an agent starts each (job, attempt, rank) once.
    #[serde(default)]
    pub attempt: u32,
    pub ranks: Vec<u32>,
    pub world: u32,
    pub program: String,
    pub args: Vec<String>,
    /// Everything the worker needs: `GW_RANK`, `GW_WORLD_SIZE`,
    /// `GW_LOCAL_RANK`, `GW_LOCAL_SIZE`, `GW_STORE`, `GW_TOKEN`, `GW_JOB_ID`,
    /// `GW_JOB_SERVER`, `GW_JOB_TOKEN` and the job's own variables. Per-rank
    /// values (`GW_RANK`, `GW_LOCAL_RANK`) are filled in by the agent.
    pub env: Vec<(String, String)>,
}

/// `POST /v1/jobs/{id}/step/begin` (job token).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StepBegin {
    pub rank: u32,
    pub step: u64,
}

/// What a worker does in one step. The same plan is returned to every rank
/// (it is stored once, when the first rank asks), so ranks never disagree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepPlan {
    pub step: u64,
    pub global_batch: u64,
    /// This rank's local batch b_i.
    pub local_batch: u64,
    /// Index of this rank's first sample in the global batch (Σ_{j<i} b_j),
    /// so the ranks' samples tile the global batch exactly.
    pub offset: u64,
    /// Gradient weight r_i = b_i / Σ b, for the weighted all-reduce.
    pub weight: f64,
    /// All-reduce algorithm to use ("auto", "ring", "tree", "rhd", "rd", "hier").
    pub algo: String,
    /// Planner's predicted step time, seconds (None before it has fits).
    pub predicted_step_s: Option<f64>,
    /// True when the scheduler preempts the job at this step: the worker
    /// must not run it, but save its state (everything through the step
    /// before) and exit 0; the job resumes from this step where the policy
    /// places it next (`GW_RESUME_STEP`). The batch fields are then 0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
}

/// `POST /v1/jobs/{id}/step/end` (job token). Idempotent per (rank, step).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepEnd {
    pub rank: u32,
    pub step: u64,
    /// Samples computed (the local batch).
    pub samples: u64,
    /// Time spent computing, seconds.
    pub compute_s: f64,
    /// Time spent in the gradient all-reduce that was not overlapped, seconds.
    pub comm_s: f64,
    /// Wall time of the whole step on this rank, seconds.
    pub step_s: f64,
    /// |g_i|² of this rank's local (mean) gradient, for the noise scale.
    pub local_grad_sq: Option<f64>,
    /// |g|² of the all-reduced gradient.
    pub global_grad_sq: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepEndReply {
    /// True when the server stopped the job (cancel or failure elsewhere):
    /// the worker should exit.
    pub stop: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_reply_from_a_server_without_roles_still_decodes() {
        let old: RegisterReply = serde_json::from_str(r#"{"heartbeat_ms": 500}"#).unwrap();
        assert_eq!(old.role, None);
        let new = RegisterReply {
            heartbeat_ms: 500,
            role: Some(Role::Admin),
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(text, r#"{"heartbeat_ms":500,"role":"admin"}"#);
    }

    #[test]
    fn roles_are_lowercase_words_and_nothing_else() {
        let req: IssueToken = serde_json::from_str(r#"{"role":"node","name":"n1"}"#).unwrap();
        assert_eq!((req.role, req.name.as_str()), (Role::Node, "n1"));
        for role in [Role::Admin, Role::Submit, Role::Node] {
            let v = serde_json::to_value(role).unwrap();
            assert_eq!(v, serde_json::Value::from(role.as_str()));
        }
        assert!(serde_json::from_str::<IssueToken>(r#"{"role":"root","name":"n1"}"#).is_err());
        assert!(serde_json::from_str::<IssueToken>(r#"{"role":"Node","name":"n1"}"#).is_err());
    }
}
