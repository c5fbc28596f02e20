//! Checks a submission before anything is stored: every absurd or
//! inconsistent request is refused with a message naming the field, so a
//! typo never becomes a job that can only fail later on some node.

use crate::server::error::{ApiError, ApiResult};
use gw_jobapi::types::{BatchChange, SubmitRequest};

/// Largest world size accepted (a guard against typos, as in gwrun).
pub const MAX_WORKERS: u32 = 4096;
/// Largest batch (global or local) accepted; far beyond any real job, and
/// small enough that sums and SQLite integers never overflow.
pub const MAX_BATCH: u64 = 1 << 40;

/// Variables the server and agent set for every worker; a job may not
/// override them.
pub const RESERVED_ENV: &[&str] = gw_rendezvous::launch_env::var::RESERVED;

/// Text that ends up in the event log and on operators' terminals: 1..=max
/// bytes, no control characters (a newline would forge a log line) and no
/// bidirectional overrides (which make a line read other than it is).
pub fn printable(what: &str, s: &str, max: usize) -> ApiResult<()> {
    let bidi = |c: char| matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if s.is_empty() || s.len() > max {
        return Err(ApiError::bad_request(format!(
            "{what} must be 1..={max} bytes (got {})",
            s.len()
        )));
    }
    if let Some(c) = s.chars().find(|&c| c.is_control() || bidi(c)) {
        return Err(ApiError::bad_request(format!(
            "{what} must be printable: it holds {:?}",
            c
        )));
    }
    Ok(())
}

/// Checks `req`; the error text says which field is wrong and why.
pub fn submission(req: &SubmitRequest) -> ApiResult<()> {
    let bad = |m: String| Err(ApiError::bad_request(m));
    if req.workers == 0 {
        return bad("workers must be at least 1 (got 0)".into());
    }
    if req.workers > MAX_WORKERS {
        return bad(format!(
            "workers = {} is more than the maximum {MAX_WORKERS}",
            req.workers
        ));
    }
    if let Some(name) = &req.name {
        printable("name", name, 128)?;
    }
    if req.batch_lo == 0 {
        return bad("batch_lo must be at least 1 (got 0)".into());
    }
    if req.batch_lo > req.batch_hi {
        return bad(format!(
            "batch bounds LO:HI = {}:{} have LO > HI",
            req.batch_lo, req.batch_hi
        ));
    }
    if req.batch_hi > MAX_BATCH {
        return bad(format!(
            "batch_hi = {} is more than the maximum {MAX_BATCH}",
            req.batch_hi
        ));
    }
    global_batch(req.workers, req.batch_lo, req.batch_hi, req.global_batch)
        .map_err(|e| ApiError::bad_request(format!("global_batch: {}", e.message)))?;
    schedule(req)?;
    if req.program.trim().is_empty() {
        return bad("program must not be empty".into());
    }
    if req.program.contains('\0') || req.args.iter().any(|a| a.contains('\0')) {
        return bad("program and args must not contain NUL bytes".into());
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad(format!("env: invalid variable name or value {k:?}"));
        }
        if RESERVED_ENV.contains(&k.as_str()) {
            return bad(format!(
                "env: {k} is set by gradwire for every worker and cannot be overridden"
            ));
        }
    }
    if let Some((_, algo)) = req.env.iter().rev().find(|(k, _)| k == "GW_ALGO")
        && !["auto", "ring", "tree", "rhd", "rd", "hier"].contains(&algo.as_str())
    {
        return bad(format!(
            "env: GW_ALGO = {algo:?} is not one of auto, ring, tree, rhd, rd, hier"
        ));
    }
    if req.steps == Some(0) || req.steps.is_some_and(|s| s > i64::MAX as u64) {
        return bad(format!(
            "steps = {} is out of range: 1..={}",
            req.steps.unwrap_or(0),
            i64::MAX
        ));
    }
    throughput(req)
}

/// The per-type speeds: known types once each, finite and not negative,
/// and not all zero (such a job could never run anywhere).
fn throughput(req: &SubmitRequest) -> ApiResult<()> {
    let bad = |m: String| Err(ApiError::bad_request(m));
    if req.throughput.len() > 256 {
        return bad(format!(
            "throughput lists {} device types; at most 256",
            req.throughput.len()
        ));
    }
    for (i, t) in req.throughput.iter().enumerate() {
        printable("throughput: device_type", &t.device_type, 128)?;
        if !(t.steps_per_s.is_finite() && (0.0..=1e9).contains(&t.steps_per_s)) {
            return bad(format!(
                "throughput of {}: {} steps/s is out of range: [0, 1e9]",
                t.device_type, t.steps_per_s
            ));
        }
        if req.throughput[..i]
            .iter()
            .any(|u| u.device_type == t.device_type)
        {
            return bad(format!(
                "throughput: device type {} is listed twice",
                t.device_type
            ));
        }
    }
    if !req.throughput.is_empty() && req.throughput.iter().all(|t| t.steps_per_s == 0.0) {
        let types: Vec<&str> = req
            .throughput
            .iter()
            .map(|t| t.device_type.as_str())
            .collect();
        return bad(format!(
            "throughput is 0 on every device type the job may use ({}), so it could never run",
            types.join(", ")
        ));
    }
    Ok(())
}

/// A global batch must be splittable into `workers` local batches within
/// [lo, hi]: `workers·lo ≤ B ≤ workers·hi`.
pub fn global_batch(workers: u32, lo: u64, hi: u64, b: u64) -> ApiResult<()> {
    let n = u64::from(workers);
    let min = n.saturating_mul(lo);
    let max = n.saturating_mul(hi);
    if b < min {
        return Err(ApiError::bad_request(format!(
            "{b} is less than workers × LO = {workers} × {lo} = {min}"
        )));
    }
    if b > max {
        return Err(ApiError::bad_request(format!(
            "{b} is more than workers × HI = {workers} × {hi} = {max}"
        )));
    }
    Ok(())
}

fn schedule(req: &SubmitRequest) -> ApiResult<()> {
    let mut prev = 0;
    for (
        i,
        BatchChange {
            step,
            global_batch: b,
        },
    ) in req.schedule.iter().enumerate()
    {
        if *step == 0 {
            return Err(ApiError::bad_request(
                "schedule: steps must be > 0 (step 0 uses global_batch)",
            ));
        }
        if i > 0 && *step <= prev {
            return Err(ApiError::bad_request(format!(
                "schedule: steps must increase (step {step} after step {prev})"
            )));
        }
        if *step > i64::MAX as u64 {
            return Err(ApiError::bad_request(format!(
                "schedule: step {step} is too large"
            )));
        }
        global_batch(req.workers, req.batch_lo, req.batch_hi, *b).map_err(|e| {
            ApiError::bad_request(format!(
                "schedule: global batch at step {step}: {}",
                e.message
            ))
        })?;
        prev = *step;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gw_jobapi::types::{DeviceThroughput, PlannerKind};

    fn ok() -> SubmitRequest {
        SubmitRequest {
            name: Some("t".into()),
            workers: 4,
            global_batch: 64,
            batch_lo: 1,
            batch_hi: 32,
            schedule: vec![BatchChange {
                step: 10,
                global_batch: 128,
            }],
            planner: PlannerKind::Optperf,
            program: "train".into(),
            args: vec![],
            env: vec![("GW_ALGO".into(), "ring".into())],
            steps: Some(100),
            throughput: vec![
                DeviceThroughput {
                    device_type: "v100".into(),
                    steps_per_s: 3.0,
                },
                DeviceThroughput {
                    device_type: "k80".into(),
                    steps_per_s: 0.0,
                },
            ],
        }
    }

    fn msg(r: SubmitRequest) -> String {
        match submission(&r) {
            Ok(()) => String::from("ok"),
            Err(e) => {
                assert_eq!(e.status, 400);
                e.message
            }
        }
    }

    #[test]
    fn accepts_a_sane_job() {
        assert_eq!(msg(ok()), "ok");
    }

    #[test]
    fn names_every_absurd_field() {
        type Change = fn(&mut SubmitRequest);
        let cases: Vec<(Change, &str)> = vec![
            (|r| r.workers = 0, "workers must be at least 1"),
            (|r| r.workers = 100_000, "workers = 100000"),
            (|r| r.batch_lo = 0, "batch_lo"),
            (|r| r.batch_lo = 40, "LO > HI"),
            (|r| r.global_batch = 3, "less than workers × LO"),
            (|r| r.global_batch = 129, "more than workers × HI"),
            (|r| r.schedule[0].step = 0, "steps must be > 0"),
            (
                |r| r.schedule[0].global_batch = 1,
                "global batch at step 10",
            ),
            (
                |r| {
                    r.schedule.push(BatchChange {
                        step: 5,
                        global_batch: 64,
                    })
                },
                "steps must increase",
            ),
            (|r| r.program = " ".into(), "program"),
            (|r| r.env.push(("GW_RANK".into(), "3".into())), "GW_RANK"),
            (
                |r| r.env.push(("A=B".into(), "3".into())),
                "invalid variable",
            ),
            (|r| r.env[0].1 = "fast".into(), "GW_ALGO"),
            (|r| r.name = Some(String::new()), "name"),
            (|r| r.steps = Some(0), "steps = 0 is out of range"),
            (
                |r| r.throughput[0].steps_per_s = 0.0,
                "throughput is 0 on every device type the job may use (v100, k80)",
            ),
            (
                |r| r.throughput[1].steps_per_s = f64::NAN,
                "throughput of k80: NaN steps/s",
            ),
            (
                |r| r.throughput[1].steps_per_s = -1.0,
                "throughput of k80: -1 steps/s",
            ),
            (
                |r| r.throughput[1].device_type = "v100".into(),
                "device type v100 is listed twice",
            ),
            (
                |r| r.throughput[1].device_type = "a\nb".into(),
                "throughput: device_type must be printable",
            ),
        ];
        for (change, want) in cases {
            let mut r = ok();
            change(&mut r);
            let m = msg(r);
            assert!(m.contains(want), "{m:?} should contain {want:?}");
        }
    }
}
