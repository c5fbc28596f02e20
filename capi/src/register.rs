//! `gwCommRegister` / `gwCommDeregister`: NCCL's `ncclCommRegister` and
//! `ncclCommDeregister`. Host memory is registered once with every
//! transport of the communicator (`Communicator::register_raw`), so calls
//! on buffers inside it skip registering them. Device memory never reaches
//! a transport (it is staged through pinned host buffers, which are
//! registered per call like other host memory), so registering it is
//! accepted and changes nothing: code written for NCCL registers its
//! device buffers and must not fail here.

use crate::gwResult_t::*;
use crate::{CResult, fail, guard, gwComm_t, gwResult_t, lookup, new_handle, out};
use gw_collectives::Registration;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// A handle's registration (`None` for device memory), and its
/// communicator's handle.
struct Entry {
    comm: usize,
    reg: Option<Registration>,
}

fn registrations() -> &'static Mutex<HashMap<usize, Entry>> {
    static M: OnceLock<Mutex<HashMap<usize, Entry>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// Registers `size` bytes at `buff` with `comm`'s transports, for later
/// calls on `comm` whose buffers lie inside that range, and stores an
/// opaque handle in `*handle` for `gwCommDeregister`. The memory must stay
/// allocated until then. `buff` may be device memory (accepted, with no
/// effect: device data is staged through pinned host buffers). Only
/// transports whose registration pins memory (RDMA) use the registration;
/// on TCP and shared memory it changes nothing. Blocks briefly; involves no
/// other rank. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommRegister(
    comm: gwComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(handle, "handle")?;
        // SAFETY: checked non-null.
        unsafe { *handle = std::ptr::null_mut() };
        if buff.is_null() || size == 0 {
            return fail(
                gwInvalidArgument,
                format!(
                    "invalid argument: register: {size} bytes at {buff:p}: a registration \
                     needs a non-null pointer and at least one byte"
                ),
            );
        }
        let reg = if crate::cuda::is_device(buff)? {
            None
        } else {
            // SAFETY: the C caller keeps the memory until gwCommDeregister.
            Some(unsafe { st.comm.register_raw(buff.cast(), size) }?)
        };
        let id = new_handle();
        registrations()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Entry {
                    comm: comm as usize,
                    reg,
                },
            );
        // SAFETY: checked non-null.
        unsafe { *handle = id as *mut c_void };
        Ok(())
    })
}

/// Withdraws a registration made by `gwCommRegister` on `comm`. It waits
/// for this rank's earlier calls on memory inside the range; the handle is
/// invalid afterwards. Should it fail, the range stays registered and the
/// handle valid. A handle of another communicator, or one already
/// deregistered, is `gwInvalidUsage`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommDeregister(comm: gwComm_t, handle: *mut c_void) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        // Looked up, not taken: should the engine refuse, the handle stays
        // valid for another try (the range is still registered).
        let (id, reg) = find(comm, handle)?;
        if let Some(reg) = reg {
            st.comm.deregister(&reg)?;
        }
        registrations()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        Ok(())
    })
}

/// Drops the registrations of a destroyed communicator (its engine, and
/// so every registration, is gone with it).
pub(crate) fn forget(comm: gwComm_t) {
    registrations()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|_, e| e.comm != comm as usize);
}

/// The registration behind `handle`, checked to be `comm`'s.
fn find(comm: gwComm_t, handle: *mut c_void) -> CResult<(usize, Option<Registration>)> {
    if handle.is_null() {
        return fail(gwInvalidArgument, "invalid argument: handle is NULL");
    }
    let m = registrations().lock().unwrap_or_else(|p| p.into_inner());
    match m.get(&(handle as usize)) {
        None => fail(
            gwInvalidUsage,
            format!("invalid usage: registration {handle:p} was deregistered or never made"),
        ),
        Some(e) if e.comm != comm as usize => fail(
            gwInvalidUsage,
            format!("invalid usage: registration {handle:p} belongs to another communicator"),
        ),
        Some(e) => Ok((handle as usize, e.reg.clone())),
    }
}
