//! The step protocol in a libgradwire built without the cargo feature
//! `step`: the calls exist (the header does not depend on how the library
//! was built) and fail, saying how to get a library that has them.

use super::super::*;
use super::{gwStepInfo, gwStepReport};

fn not_built() -> Failure {
    Failure {
        code: gwInvalidUsage,
        msg: "invalid usage: this libgradwire was built without the job server's step protocol; \
              rebuild it with `cargo build --release -p gw-capi --features step`"
            .into(),
    }
}

pub(super) fn begin(
    _comm: gwComm_t,
    _st: &CommState,
    _info: &mut Option<gwStepInfo>,
) -> CResult<()> {
    Err(not_built())
}

pub(super) fn end(_comm: gwComm_t, _st: &CommState, _r: &gwStepReport) -> CResult<bool> {
    Err(not_built())
}

#[cfg(test)]
mod tests {
    use super::super::super::*;
    use super::super::*;

    /// Needs a real communicator: a world of one over a local store.
    #[test]
    fn without_the_feature_the_calls_say_how_to_get_them() {
        let mut id = gwUniqueId {
            internal: [0; GW_UNIQUE_ID_BYTES],
        };
        let mut comm: gwComm_t = std::ptr::null_mut();
        let mut info = std::mem::MaybeUninit::<gwStepInfo>::uninit();
        // SAFETY: valid out-pointers; the communicator is destroyed below.
        unsafe {
            assert_eq!(gwGetUniqueId(&mut id), gwSuccess);
            assert_eq!(gwCommInitRank(&mut comm, 1, id, 0), gwSuccess);
            assert_eq!(gwStepBegin(comm, info.as_mut_ptr()), gwInvalidUsage);
            let msg = CStr::from_ptr(gwGetLastError(comm))
                .to_string_lossy()
                .into_owned();
            assert!(msg.contains("--features step"), "{msg}");
            assert_eq!(gwCommDestroy(comm), gwSuccess);
        }
    }
}
