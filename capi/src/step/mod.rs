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

/// The job server client: in the library only with the cargo feature
/// `step`, since it brings an HTTP client into every program that loads
/// libgradwire; without it the calls exist and say how to get them.
#[cfg(feature = "step")]
mod client;
#[cfg(not(feature = "step"))]
#[path = "absent.rs"]
mod client;

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

/// Asks the job server for this rank's plan of the next step (its local
/// batch, gradient weight and all-reduce algorithm) and fills `*info`.
/// Calling it again before `gwStepEnd` returns the same step's plan. Retries
/// a server that is down for `GW_JOB_RETRY_S` seconds (default 60), then
/// returns `gwTimeout`; a job the server has stopped is `gwAborted` (exit);
/// a job a scheduling policy preempts is `gwPreempted` with `info->step` the
/// step it resumes at (checkpoint everything before it and exit 0);
/// without `GW_JOB_SERVER` (not started by a gwjob agent) `gwInvalidUsage`;
/// in a libgradwire built without the cargo feature `step`, always
/// `gwInvalidUsage`, saying so. Blocks; thread-safe (calls on one
/// communicator are serialised).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwStepBegin(comm: gwComm_t, info: *mut gwStepInfo) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(info, "info")?;
        let mut next = None;
        let r = client::begin(comm, &st, &mut next);
        if let Some(next) = next {
            // SAFETY: checked non-null.
            unsafe { *info = next };
        }
        r
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
        let stopped = client::end(comm, &st, &r)?;
        if !stop.is_null() {
            // SAFETY: checked non-null.
            unsafe { *stop = stopped as c_int };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
