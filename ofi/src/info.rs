//! Choosing a provider: fi_getinfo with gradwire's needs, and what it
//! negotiated.
//!
//! gradwire needs an RDM endpoint (reliable, connectionless), messages and
//! RMA reads and writes with at least 4 bytes of immediate data; it can
//! honour the `FI_CONTEXT`/`FI_RX_CQ_DATA` modes and every mr_mode bit but
//! raw keys and unmap notification (device memory, `FI_MR_HMEM`, only when
//! asked for with `FI_HMEM`: GPUDirect RDMA). When asked for a
//! provider that cannot serve, the error says whether it is absent (and
//! which ones exist) or what it lacks, so a wrong `GW_TRANSPORT` setting
//! is answered in one line.

use crate::error::{Error, Result};
use crate::ffi::{self, FiInfo, GwAttr, GwHints};
use crate::flags::*;
use crate::{c_text, fi_call, library};
use std::ffi::CString;

/// The providers tried, in order, when none is named: RDMA first, then
/// TCP, then shared memory (one host only).
pub const PREFERRED_PROVIDERS: &[&str] = &["verbs;ofi_rxm", "efa", "tcp;ofi_rxm", "shm"];

/// The least immediate data a write must carry: gradwire's immediates are
/// 32 bits, as in verbs.
const MIN_CQ_DATA: u64 = 4;

/// A provider's progress model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Unspecified.
    Unspec,
    /// The provider moves data on its own.
    Auto,
    /// Data moves only while the application calls into the provider
    /// (reads the completion queue).
    Manual,
    /// A value this binding does not know.
    Other(i32),
}

impl Progress {
    fn from_raw(v: i32) -> Progress {
        match v {
            0 => Progress::Unspec,
            1 => Progress::Auto,
            2 => Progress::Manual,
            v => Progress::Other(v),
        }
    }
}

/// What fi_getinfo negotiated for one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// `fabric_attr.prov_name`, such as `"tcp;ofi_rxm"`.
    pub provider: String,
    /// `fabric_attr.name`.
    pub fabric: String,
    /// `domain_attr.name` (an interface or device).
    pub domain: String,
    /// The provider's version as FI_VERSION(major, minor).
    pub prov_version: u32,
    /// Capabilities granted.
    pub caps: u64,
    /// Mode bits the provider requires (`FI_CONTEXT`, `FI_RX_CQ_DATA`, ...).
    pub mode: u64,
    /// `domain_attr.mr_mode`: what memory registration must honour.
    pub mr_mode: u64,
    /// Bytes of immediate data a write may carry.
    pub cq_data_size: usize,
    /// Largest message or RMA transfer.
    pub max_msg_size: usize,
    /// Largest `fi_inject`.
    pub inject_size: usize,
    /// Transmit queue depth.
    pub tx_size: usize,
    /// Receive queue depth.
    pub rx_size: usize,
    /// Size of a registration key in bytes.
    pub mr_key_size: usize,
    /// Data progress model.
    pub data_progress: Progress,
    /// Control progress model.
    pub control_progress: Progress,
    /// `domain_attr.threading` (enum fi_threading).
    pub threading: i32,
}

impl Info {
    pub(crate) fn from_raw(info: *const FiInfo) -> Info {
        // SAFETY: GwAttr is plain data; all-zero is a valid value.
        let mut a: GwAttr = unsafe { std::mem::zeroed() };
        // SAFETY: info is a live fi_info from fi_getinfo/fi_dupinfo and a
        // is writable; the shim copies fields and bounded names.
        unsafe { ffi::gw_ofi_info_attr(info, &mut a) };
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Info {
            provider: c_text(&a.prov_name),
            fabric: c_text(&a.fabric_name),
            domain: c_text(&a.domain_name),
            prov_version: a.prov_version,
            caps: a.caps,
            mode: a.mode,
            mr_mode: a.mr_mode,
            cq_data_size: size(a.cq_data_size),
            max_msg_size: size(a.max_msg_size),
            inject_size: size(a.inject_size),
            tx_size: size(a.tx_size),
            rx_size: size(a.rx_size),
            mr_key_size: size(a.mr_key_size),
            data_progress: Progress::from_raw(a.data_progress),
            control_progress: Progress::from_raw(a.control_progress),
            threading: a.threading,
        }
    }

    /// Whether `bit` of the mr_mode is set.
    pub fn mr(&self, bit: u64) -> bool {
        self.mr_mode & bit != 0
    }

    /// The mr_mode bits by name, such as `"FI_MR_LOCAL|FI_MR_VIRT_ADDR"`.
    pub fn mr_mode_names(&self) -> String {
        bit_names(self.mr_mode, MR_MODE_NAMES)
    }

    /// The mode bits by name.
    pub fn mode_names(&self) -> String {
        bit_names(self.mode, MODE_NAMES)
    }

    /// The first thing gradwire needs that this provider lacks.
    fn lacks(&self) -> Option<String> {
        if self.caps & WANTED_CAPS != WANTED_CAPS {
            return Some(bit_names(WANTED_CAPS & !self.caps, CAP_NAMES));
        }
        if (self.cq_data_size as u64) < MIN_CQ_DATA {
            return Some(format!(
                "cq_data_size >= {MIN_CQ_DATA} (it has {})",
                self.cq_data_size
            ));
        }
        None
    }
}

/// A list from fi_getinfo, freed on drop.
pub(crate) struct InfoList(*mut FiInfo);

impl InfoList {
    /// fi_getinfo; an empty list for `-FI_ENODATA` (no match).
    fn get(prov: Option<&str>, strict: bool) -> Result<InfoList> {
        Self::get_with(prov, strict, false)
    }

    /// As [`InfoList::get`]; with `hmem`, gradwire's needs plus device
    /// memory (`FI_HMEM`, and the `FI_MR_HMEM` registration it implies).
    fn get_with(prov: Option<&str>, strict: bool, hmem: bool) -> Result<InfoList> {
        library()?;
        let cprov = match prov {
            Some(p) => Some(
                CString::new(p)
                    .map_err(|_| Error::Usage(format!("provider name {p:?} holds a NUL byte")))?,
            ),
            None => None,
        };
        let hints = if strict {
            GwHints {
                prov_name: cprov.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                caps: WANTED_CAPS | if hmem { FI_HMEM } else { 0 },
                mode: ACCEPTED_MODE,
                mr_mode: ACCEPTED_MR_MODE | if hmem { FI_MR_HMEM } else { 0 },
                ep_type: ffi::FI_EP_RDM,
                threading: ffi::FI_THREAD_DOMAIN,
                no_hints: 0,
                pad: 0,
            }
        } else {
            // Whatever the provider offers, to say what it lacks: any
            // endpoint type, any capabilities, any mode.
            GwHints {
                prov_name: cprov.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                caps: 0,
                mode: u64::MAX,
                mr_mode: ACCEPTED_MR_MODE | FI_MR_RAW | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT,
                ep_type: 0,
                threading: 0,
                no_hints: i32::from(prov.is_none()),
                pad: 0,
            }
        };
        let mut list = std::ptr::null_mut();
        // SAFETY: hints and the provider string outlive the call; list is
        // written with a list that InfoList frees.
        let ret = unsafe { ffi::gw_ofi_getinfo(&hints, &mut list) };
        if ret == -ffi::FI_ENODATA {
            return Ok(InfoList(std::ptr::null_mut()));
        }
        if ret != 0 {
            return Err(Error::GetInfo(fi_call("fi_getinfo", ret as isize)));
        }
        Ok(InfoList(list))
    }

    /// The entries, with their negotiated attributes.
    fn entries(&self) -> Vec<(*mut FiInfo, Info)> {
        let mut out = Vec::new();
        let mut p = self.0;
        while !p.is_null() {
            out.push((p, Info::from_raw(p)));
            // SAFETY: p is an entry of the list this InfoList owns.
            p = unsafe { ffi::gw_ofi_info_next(p) };
        }
        out
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once.
        unsafe { ffi::gw_ofi_freeinfo(self.0) };
    }
}

/// One fi_info entry of our own (fi_dupinfo), freed on drop.
pub(crate) struct OwnedInfo(pub(crate) *mut FiInfo);

impl Drop for OwnedInfo {
    fn drop(&mut self) {
        // SAFETY: the entry came from fi_dupinfo and is freed once.
        unsafe { ffi::gw_ofi_freeinfo(self.0) };
    }
}

/// The distinct provider names fi_getinfo lists with no filter.
pub fn providers() -> Result<Vec<String>> {
    let list = InfoList::get(None, false)?;
    let mut names: Vec<String> = Vec::new();
    for (_, info) in list.entries() {
        if !names.contains(&info.provider) {
            names.push(info.provider);
        }
    }
    Ok(names)
}

/// Whether provider `prov` can register device memory (`FI_HMEM` with
/// gradwire's other needs): `None` if it can, else why not, in words.
/// GPUDirect RDMA needs it.
pub fn hmem_support(prov: &str) -> Result<Option<String>> {
    let list = InfoList::get_with(Some(prov), true, true)?;
    let found = list.entries().into_iter().any(|(_, i)| {
        i.provider.eq_ignore_ascii_case(prov) && i.caps & FI_HMEM != 0 && i.lacks().is_none()
    });
    Ok((!found).then(|| format!("provider {prov} offers no FI_HMEM with FI_MSG and FI_RMA")))
}

/// The first entry of provider `prov` (exactly that `prov_name`) that
/// meets gradwire's needs (with `hmem`, also device memory), or why there
/// is none.
pub(crate) fn select(prov: &str, hmem: bool) -> Result<(OwnedInfo, Info)> {
    let list = InfoList::get_with(Some(prov), true, hmem)?;
    let mut lacking = None;
    for (p, info) in list.entries() {
        if !info.provider.eq_ignore_ascii_case(prov) {
            continue;
        }
        if let Some(missing) = info.lacks() {
            lacking.get_or_insert(missing);
            continue;
        }
        if hmem && info.caps & FI_HMEM == 0 {
            lacking.get_or_insert("FI_HMEM".to_owned());
            continue;
        }
        // SAFETY: p is an entry of the live list; fi_dupinfo copies it.
        let dup = unsafe { ffi::gw_ofi_info_dup(p) };
        if dup.is_null() {
            return Err(Error::GetInfo(fi_call(
                "fi_dupinfo",
                -(ffi::FI_ENOMEM as isize),
            )));
        }
        return Ok((OwnedInfo(dup), info));
    }
    if let Some(missing) = lacking {
        return Err(Error::MissingCapability {
            provider: prov.to_owned(),
            missing,
        });
    }
    if hmem && select(prov, false).is_ok() {
        // It serves gradwire, only not with device memory.
        return Err(Error::MissingCapability {
            provider: prov.to_owned(),
            missing: "FI_HMEM (device memory)".to_owned(),
        });
    }
    // Nothing matched our hints: is the provider there at all?
    let any = InfoList::get(Some(prov), false)?;
    let offered: Vec<Info> = any
        .entries()
        .into_iter()
        .map(|(_, i)| i)
        .filter(|i| i.provider.eq_ignore_ascii_case(prov))
        .collect();
    if offered.is_empty() {
        return Err(Error::UnknownProvider {
            wanted: prov.to_owned(),
            available: providers()?,
        });
    }
    Err(Error::MissingCapability {
        provider: prov.to_owned(),
        missing: lack_summary(&offered),
    })
}

/// What a provider's entries, obtained without gradwire's hints, lack.
fn lack_summary(offered: &[Info]) -> String {
    let rdm: Vec<&Info> = offered.iter().filter(|i| i.caps != 0).collect();
    let caps = rdm.iter().fold(0, |c, i| c | i.caps);
    if caps & WANTED_CAPS != WANTED_CAPS {
        return bit_names(WANTED_CAPS & !caps, CAP_NAMES);
    }
    let modes: Vec<String> = offered
        .iter()
        .filter(|i| i.mode & !ACCEPTED_MODE != 0)
        .map(|i| bit_names(i.mode & !ACCEPTED_MODE, MODE_NAMES))
        .collect();
    if let Some(m) = modes.first() {
        return format!("an RDM endpoint without mode {m}, which gradwire cannot honour");
    }
    let mr: Vec<String> = offered
        .iter()
        .filter(|i| i.mr_mode & !ACCEPTED_MR_MODE != 0)
        .map(|i| bit_names(i.mr_mode & !ACCEPTED_MR_MODE, MR_MODE_NAMES))
        .collect();
    if let Some(m) = mr.first() {
        return format!("an RDM endpoint without mr_mode {m}, which gradwire cannot honour");
    }
    "an RDM endpoint with FI_MSG and FI_RMA under FI_THREAD_DOMAIN".to_owned()
}

/// The provider named, or the first of [`PREFERRED_PROVIDERS`] that
/// serves, with a sentence saying why it was chosen.
pub(crate) fn choose(prov: Option<&str>, hmem: bool) -> Result<(OwnedInfo, Info, String)> {
    if let Some(p) = prov {
        let (raw, info) = select(p, hmem)?;
        return Ok((raw, info, format!("asked for {p}")));
    }
    let mut reasons = Vec::new();
    for p in PREFERRED_PROVIDERS {
        match select(p, hmem) {
            Ok((raw, info)) => {
                reasons.push(format!("chose {p}"));
                return Ok((raw, info, reasons.join("; ")));
            }
            Err(Error::UnknownProvider { .. }) => reasons.push(format!("{p}: not available")),
            Err(Error::MissingCapability { missing, .. }) => {
                reasons.push(format!("{p}: lacks {missing}"))
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::NoProvider(reasons.join("; ")))
}
