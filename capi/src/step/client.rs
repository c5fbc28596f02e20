//! The step protocol's client side for the C ABI, built with the cargo
//! feature `step`: gw-jobapi's `StepClient` (retries, backoff, idempotence
//! shared with Rust workers), one per communicator.

use super::super::*;
use super::{GW_STEP_ALGO_BYTES, gwStepInfo, gwStepReport};
use gw_jobapi::step::{StepClient, StepError, StepReport};
use gw_jobapi::types::StepPlan;
use std::collections::HashMap;

fn clients() -> &'static Mutex<HashMap<usize, Arc<Mutex<StepClient>>>> {
    static M: OnceLock<Mutex<HashMap<usize, Arc<Mutex<StepClient>>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn code_of_step(e: &StepError) -> gwResult_t {
    match e {
        StepError::Env { .. } | StepError::NotBegun { .. } => gwInvalidUsage,
        StepError::ServerGone { .. } => gwTimeout,
        StepError::Stopped { .. } => gwAborted,
        StepError::Preempted { .. } => gwPreempted,
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

/// What `gwStepBegin` tells a worker that is preempted at `step`: only the
/// step (where it resumes); no samples, no weight.
fn preempted_info(step: u64) -> gwStepInfo {
    info_of(&StepPlan {
        step,
        global_batch: 0,
        local_batch: 0,
        offset: 0,
        weight: 0.0,
        algo: String::new(),
        predicted_step_s: None,
        checkpoint: true,
    })
}

/// This rank's plan of the next step into `info`; on preemption `info`
/// holds the step to resume at and the result is `gwPreempted`.
pub(super) fn begin(comm: gwComm_t, st: &CommState, info: &mut Option<gwStepInfo>) -> CResult<()> {
    let c = client_of(comm, st)?;
    let r = c.lock().unwrap_or_else(|p| p.into_inner()).begin();
    match r {
        Ok(plan) => {
            *info = Some(info_of(&plan));
            Ok(())
        }
        Err(e) => {
            if let StepError::Preempted { step, .. } = &e {
                *info = Some(preempted_info(*step));
            }
            Err(step_failure(e))
        }
    }
}

/// Reports the step begun last; whether the server wants the worker to stop.
pub(super) fn end(comm: gwComm_t, st: &CommState, r: &gwStepReport) -> CResult<bool> {
    let c = client_of(comm, st)?;
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
    Ok(reply.stop)
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
            checkpoint: false,
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
        let preempted = StepError::Preempted {
            job_id: "j".into(),
            step: 9,
        };
        assert_eq!(code_of_step(&preempted), gwPreempted);
        let i = preempted_info(9);
        assert_eq!((i.step, i.local_batch, i.weight), (9, 0, 0.0));
        assert_eq!(i.algo[0], 0);
        assert_eq!(
            code_of_step(&StepError::NotBegun { next: 0 }),
            gwInvalidUsage
        );
    }
}
