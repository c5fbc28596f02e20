//! The step protocol in the C ABI: `gwStepBegin` / `gwStepEnd` over
//! gw-jobapi's `StepClient`, so C and Python workers speak the protocol
//! through the same code (retries, backoff, idempotence) as Rust ones.
//!
//! A worker's step client belongs to its communicator: it is made on the
//! first `gwStepBegin` from the variables a gwjob agent sets (`GW_JOB_SERVER`,
//! `GW_JOB_ID`, `GW_JOB_TOKEN`, `GW_JOB_RETRY_S`) and the communicator's
//! rank, and lives in a registry keyed by the communicator handle. Handles
//! are never reused, so a client of a destroyed communicator can never be
//! picked up by another one; such clients are dropped the next time a
//! client is made.

use super::*;
use gw_jobapi::step::{StepClient, StepError, StepReport};
use gw_jobapi::types::StepPlan;

/// Bytes of `gwStepInfo.algo`, NUL included.
pub const GW_STEP_ALGO_BYTES: usize = 16;

/// What `gwStepBegin` tells a worker about its next step.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gwStepInfo {
    /// Step number (0, 1, ...; counted by the library).
    pub step: u64,
    /// Samples in the whole step, over all ranks.
    pub global_batch: u64,
    /// This rank's samples b_i.
    pub local_batch: u64,
    /// Index of this rank's first sample in the global batch (Σ_{j<i} b_j).
    pub offset: u64,
    /// Gradient weight r_i = b_i / Σ b: pass it to `gwAllReduceWeighted`.
    pub weight: f64,
    /// All-reduce algorithm to use, NUL-terminated ("auto", "ring", "tree", "rhd", "rd", "hier").
    pub algo: [c_char; 16],
    /// The planner's predicted step time in seconds, or NaN when unknown.
    pub predicted_step_s: f64,
}

/// What a worker reports to `gwStepEnd` about the step it ends.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gwStepReport {
    /// Samples computed (normally the step's local_batch).
    pub samples: u64,
    /// Seconds spent computing.
    pub compute_s: f64,
    /// Seconds spent in the gradient all-reduce that did not overlap compute.
    pub comm_s: f64,
    /// Wall time of the whole step on this rank, seconds.
    pub step_s: f64,
    /// |g_i|² of this rank's local mean gradient, or NaN when not measured.
    pub local_grad_sq: f64,
    /// |g|² of the all-reduced gradient, or NaN when not measured.
    pub global_grad_sq: f64,
}

fn clients() -> &'static Mutex<HashMap<usize, Arc<Mutex<StepClient>>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<Mutex<StepClient>>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn code_of_step(e: &StepError) -> gwResult_t {
    match e {
        StepError::Env { .. } | StepError::NotBegun { .. } => gwInvalidUsage,
        StepError::ServerGone { .. } => gwTimeout,
        StepError::Stopped { .. } => gwAborted,
        StepError::Rejected(_) => gwRemoteError,
        StepError::Protocol(_) => gwInternalError,
    }
}

fn step_failure(e: StepError) -> Failure {
    Failure {
        code: code_of_step(&e),
        msg: e.to_string(),
    }
}

/// The step client of `comm`, made on first use.
fn client_of(comm: gwComm_t, st: &CommState) -> CResult<Arc<Mutex<StepClient>>> {
    let mut m = clients().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = m.get(&(comm as usize)) {
        return Ok(c.clone());
    }
    let c = StepClient::from_env_with_rank(st.comm.rank())
        .map_err(step_failure)?
        .ok_or_else(|| Failure {
            code: gwInvalidUsage,
            msg: "invalid usage: GW_JOB_SERVER is not set: the step protocol needs a program \
                  started by a gwjob agent (gwjob submit)"
                .into(),
        })?;
    // Forget the clients of destroyed communicators.
    let live = comms().lock().unwrap_or_else(|p| p.into_inner());
    m.retain(|k, _| live.contains_key(k));
    drop(live);
    let c = Arc::new(Mutex::new(c));
    m.insert(comm as usize, c.clone());
    Ok(c)
}

fn info_of(p: &StepPlan) -> gwStepInfo {
    let mut algo = [0 as c_char; GW_STEP_ALGO_BYTES];
    for (d, s) in algo.iter_mut().zip(
        p.algo
            .bytes()
            .filter(|b| *b != 0)
            .take(GW_STEP_ALGO_BYTES - 1),
    ) {
        *d = s as c_char;
    }
    gwStepInfo {
        step: p.step,
        global_batch: p.global_batch,
        local_batch: p.local_batch,
        offset: p.offset,
        weight: p.weight,
        algo,
        predicted_step_s: p.predicted_step_s.unwrap_or(f64::NAN),
    }
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Asks the job server for this rank's plan of the next step (its local
/// batch, gradient weight and all-reduce algorithm) and fills `*info`.
/// Calling it again before `gwStepEnd` returns the same step's plan. Retries
/// a server that is down for `GW_JOB_RETRY_S` seconds (default 60), then
/// returns `gwTimeout`; a job the server has stopped is `gwAborted` (exit);
/// without `GW_JOB_SERVER` (not started by a gwjob agent) `gwInvalidUsage`.
/// Blocks; thread-safe (calls on one communicator are serialised).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwStepBegin(comm: gwComm_t, info: *mut gwStepInfo) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(info, "info")?;
        let c = client_of(comm, &st)?;
        let plan = c
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .begin()
            .map_err(step_failure)?;
        // SAFETY: checked non-null.
        unsafe { *info = info_of(&plan) };
        Ok(())
    })
}

/// Reports the step begun last (measured times and sample count) and moves
/// to the next step. Sets `*stop` (if not NULL) to 1 when the job server
/// wants this worker to stop (the job was cancelled or failed elsewhere),
/// else 0. Safe to call again after a failure (the server records each step
/// once). `gwInvalidUsage` without a `gwStepBegin` first. Blocks; thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwStepEnd(
    comm: gwComm_t,
    report: *const gwStepReport,
    stop: *mut c_int,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        if report.is_null() {
            return fail(gwInvalidArgument, "invalid argument: report is NULL");
        }
        // SAFETY: checked non-null; the caller provides a full gwStepReport.
        let r = unsafe { *report };
        let c = client_of(comm, &st)?;
        let rep = StepReport {
            samples: r.samples,
            compute_s: r.compute_s,
            comm_s: r.comm_s,
            step_s: r.step_s,
            local_grad_sq: finite(r.local_grad_sq),
            global_grad_sq: finite(r.global_grad_sq),
        };
        let reply = c
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .end(&rep)
            .map_err(step_failure)?;
        if !stop.is_null() {
            // SAFETY: checked non-null.
            unsafe { *stop = reply.stop as c_int };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_become_step_infos() {
        let p = StepPlan {
            step: 7,
            global_batch: 100,
            local_batch: 30,
            offset: 40,
            weight: 0.3,
            algo: "a-very-long-algorithm-name".into(),
            predicted_step_s: None,
        };
        let i = info_of(&p);
        assert_eq!(
            (i.step, i.global_batch, i.local_batch, i.offset),
            (7, 100, 30, 40)
        );
        assert_eq!(i.weight, 0.3);
        assert!(i.predicted_step_s.is_nan());
        // SAFETY: algo is NUL-terminated by construction.
        let algo = unsafe { CStr::from_ptr(i.algo.as_ptr()) };
        assert_eq!(algo.to_str().unwrap(), "a-very-long-alg");
        let i = info_of(&StepPlan {
            algo: "ring".into(),
            predicted_step_s: Some(1.5),
            ..p
        });
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(i.algo.as_ptr()) }, c"ring");
        assert_eq!(i.predicted_step_s, 1.5);
    }

    #[test]
    fn step_errors_map_to_result_codes() {
        let gone = StepError::ServerGone {
            server: "http://s".into(),
            waited: Duration::from_secs(60),
            last: gw_jobapi::http::HttpError::Transport {
                url: "u".into(),
                detail: "refused".into(),
            },
        };
        assert_eq!(code_of_step(&gone), gwTimeout);
        let stopped = StepError::Stopped {
            job_id: "j".into(),
            reason: "cancelled".into(),
        };
        assert_eq!(code_of_step(&stopped), gwAborted);
        assert_eq!(
            code_of_step(&StepError::NotBegun { next: 0 }),
            gwInvalidUsage
        );
    }

    #[test]
    fn null_and_unknown_handles_are_errors() {
        let mut info = std::mem::MaybeUninit::<gwStepInfo>::uninit();
        // SAFETY: invalid handles are detected before any pointer is used.
        unsafe {
            assert_eq!(
                gwStepBegin(std::ptr::null_mut(), info.as_mut_ptr()),
                gwInvalidArgument
            );
            assert_eq!(
                gwStepBegin(0x7770 as gwComm_t, info.as_mut_ptr()),
                gwInvalidUsage
            );
            assert_eq!(
                gwStepEnd(0x7770 as gwComm_t, std::ptr::null(), std::ptr::null_mut()),
                gwInvalidUsage
            );
        }
    }
}
