//! CUDA events: the completions the staging pipeline waits for.

use crate::api::{CUevent, CUstream};
use crate::driver::Driver;
use crate::error::Result;

/// An event without timing (`CU_EVENT_DISABLE_TIMING`), destroyed on drop.
pub struct Event {
    drv: &'static Driver,
    ev: CUevent,
}

// SAFETY: an event handle may be recorded and waited on from any thread.
unsafe impl Send for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("ev", &self.ev).finish()
    }
}

impl Event {
    /// A new event in the current context.
    pub fn new(drv: &'static Driver) -> Result<Event> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flag 2 is CU_EVENT_DISABLE_TIMING.
        let code = unsafe { (drv.api().event_create)(&mut ev, 2) };
        drv.check("cuEventCreate", code, "")?;
        Ok(Event { drv, ev })
    }

    /// Marks the point in `stream` the event completes at.
    ///
    /// # Safety
    /// `stream` is null or a live stream of the event's context.
    pub unsafe fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: per the contract; the event is live.
        let code = unsafe { (self.drv.api().event_record)(self.ev, stream) };
        self.drv.check("cuEventRecord", code, "")
    }

    /// Waits until the work before the recorded point has run.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: a live event.
        let code = unsafe { (self.drv.api().event_synchronize)(self.ev) };
        self.drv.check("cuEventSynchronize", code, "")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe { (self.drv.api().event_destroy)(self.ev) };
    }
}
