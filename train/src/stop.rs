//! Why a worker stopped before its last step: what the plan source and the
//! training loop both report, so it lives apart from either.

/// Why the worker stopped early.
#[derive(Debug)]
pub enum Stop {
    /// The job server ended the job (cancel, or a failure elsewhere) at this step.
    ByServer {
        step: u64,
        reason: String,
    },
    /// A scheduling policy took the job off its nodes at this step: the
    /// state through `step - 1` is saved and the job resumes at `step`.
    Preempted {
        step: u64,
    },
    Failed(String),
}

impl From<String> for Stop {
    fn from(s: String) -> Stop {
        Stop::Failed(s)
    }
}
