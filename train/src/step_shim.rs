//! TEMPORARY stand-in for `gw_jobapi::step` (being written in parallel), with
//! the agreed API, so gwtrain builds before it lands. Removed once it exists.

pub use gw_jobapi::types::{StepEndReply, StepPlan};

#[derive(Debug)]
pub struct StepError(pub String);

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug)]
pub struct StepReport {
    pub samples: u64,
    pub compute_s: f64,
    pub comm_s: f64,
    pub step_s: f64,
    pub local_grad_sq: Option<f64>,
    pub global_grad_sq: Option<f64>,
}

pub struct StepClient;

impl StepClient {
    pub fn from_env() -> Result<Option<StepClient>, StepError> {
        match std::env::var("GW_JOB_SERVER") {
            Ok(_) => Err(StepError("the step client is not built yet".into())),
            Err(_) => Ok(None),
        }
    }

    pub fn begin(&mut self) -> Result<StepPlan, StepError> {
        Err(StepError("the step client is not built yet".into()))
    }

    pub fn end(&mut self, _r: &StepReport) -> Result<StepEndReply, StepError> {
        Err(StepError("the step client is not built yet".into()))
    }
}
