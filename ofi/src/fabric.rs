//! The fabric and domain: the provider chosen, and the resource domain
//! (a NIC, or the host for shm and TCP) that endpoints and memory
//! registrations belong to.
//!
//! Each is an `Arc`-shared core, so that an endpoint or a registration
//! keeps its domain, and the domain its fabric, open until the last user
//! is gone: libfabric refuses (or crashes on) closing a domain before its
//! objects. The domain's lock serialises every call on it and its
//! objects, which is what `FI_THREAD_DOMAIN` asks of the application.

use crate::error::{Error, Result};
use crate::ffi::{self, Fid, FidDomain, FidFabric};
use crate::info::{Info, OwnedInfo, choose};
use crate::{fi_call, library};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) struct FabricCore {
    pub(crate) raw_info: OwnedInfo,
    pub(crate) fabric: *mut FidFabric,
    pub(crate) info: Info,
    pub(crate) choice: String,
    lock: Mutex<()>,
}

// SAFETY: the fi_info is read only by the shim after creation, and the
// fabric object is used only under `lock` (fi_domain) or under a domain's
// lock (fi_trywait, which reads the fabric's wait list); libfabric objects
// are not tied to the thread that opened them.
unsafe impl Send for FabricCore {}
// SAFETY: as above: all shared use goes through a lock.
unsafe impl Sync for FabricCore {}

impl Drop for FabricCore {
    fn drop(&mut self) {
        // SAFETY: the fabric was opened by fi_fabric and every domain,
        // which holds an Arc to this core, is closed already.
        let ret = unsafe { ffi::gw_ofi_close(self.fabric.cast::<Fid>()) };
        if ret != 0 {
            tracing::warn!("{}", fi_call("fi_close(fabric)", ret as isize));
        }
    }
}

/// A libfabric fabric: one provider, as chosen by fi_getinfo.
#[derive(Clone)]
pub struct Fabric {
    pub(crate) core: Arc<FabricCore>,
}

impl Fabric {
    /// Opens the fabric of `provider` (a `prov_name` such as
    /// `"tcp;ofi_rxm"` or `"shm"`), or of the first usable one of
    /// [`crate::PREFERRED_PROVIDERS`] when `None`.
    pub fn open(provider: Option<&str>) -> Result<Fabric> {
        Self::open_with(provider, false)
    }

    /// [`Fabric::open`] for a provider that also registers device memory
    /// (`FI_HMEM`, for GPUDirect RDMA); one without it is
    /// [`Error::MissingCapability`] naming FI_HMEM.
    pub fn open_hmem(provider: Option<&str>) -> Result<Fabric> {
        Self::open_with(provider, true)
    }

    fn open_with(provider: Option<&str>, hmem: bool) -> Result<Fabric> {
        library()?;
        let (raw_info, info, choice) = choose(provider, hmem)?;
        let mut fabric = std::ptr::null_mut();
        // SAFETY: raw_info is a live fi_info; fabric receives the object,
        // which FabricCore closes.
        let ret = unsafe { ffi::gw_ofi_fabric_open(raw_info.0, &mut fabric) };
        if ret != 0 {
            return Err(Error::Fabric {
                provider: info.provider,
                call: fi_call("fi_fabric", ret as isize),
            });
        }
        Ok(Fabric {
            core: Arc::new(FabricCore {
                raw_info,
                fabric,
                info,
                choice,
                lock: Mutex::new(()),
            }),
        })
    }

    /// What fi_getinfo negotiated.
    pub fn info(&self) -> &Info {
        &self.core.info
    }

    /// Why this provider: "asked for shm", or "verbs;ofi_rxm: not
    /// available; efa: not available; chose tcp;ofi_rxm".
    pub fn choice(&self) -> &str {
        &self.core.choice
    }
}

pub(crate) struct DomainCore {
    pub(crate) fabric: Arc<FabricCore>,
    pub(crate) domain: *mut FidDomain,
    lock: Mutex<()>,
    next_key: AtomicU64,
}

// SAFETY: the domain and all its objects are used only under `lock`
// (FI_THREAD_DOMAIN); libfabric objects are not tied to a thread.
unsafe impl Send for DomainCore {}
// SAFETY: as above.
unsafe impl Sync for DomainCore {}

impl DomainCore {
    /// The lock every call on this domain or its objects holds.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn info(&self) -> &Info {
        &self.fabric.info
    }

    /// A registration key no other registration of this domain asked for
    /// (used where the provider does not choose keys, no FI_MR_PROV_KEY).
    pub(crate) fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for DomainCore {
    fn drop(&mut self) {
        let _g = self.lock();
        // SAFETY: every endpoint and registration holds an Arc to this
        // core, so none is open now.
        let ret = unsafe { ffi::gw_ofi_close(self.domain.cast::<Fid>()) };
        if ret != 0 {
            tracing::warn!("{}", fi_call("fi_close(domain)", ret as isize));
        }
    }
}

/// A libfabric domain of a [`Fabric`].
#[derive(Clone)]
pub struct Domain {
    pub(crate) core: Arc<DomainCore>,
}

impl Domain {
    /// Opens the domain fi_getinfo chose.
    pub fn open(fabric: &Fabric) -> Result<Domain> {
        let f = &fabric.core;
        let mut domain = std::ptr::null_mut();
        let ret = {
            let _g = f.lock.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the fabric and its fi_info are live; domain receives
            // the object, which DomainCore closes.
            unsafe { ffi::gw_ofi_domain_open(f.fabric, f.raw_info.0, &mut domain) }
        };
        if ret != 0 {
            return Err(Error::Domain {
                provider: f.info.provider.clone(),
                call: fi_call("fi_domain", ret as isize),
            });
        }
        Ok(Domain {
            core: Arc::new(DomainCore {
                fabric: f.clone(),
                domain,
                lock: Mutex::new(()),
                next_key: AtomicU64::new(1),
            }),
        })
    }

    /// What fi_getinfo negotiated.
    pub fn info(&self) -> &Info {
        self.core.info()
    }
}
