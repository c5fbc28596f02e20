//! Opening a device: the list, the port, the GID, as one [`Hca`].
//!
//! Discovery goes device list → `GW_IB_HCA` → `ibv_open_device` →
//! `ibv_query_device` for the port count → `ibv_query_port` on each →
//! first ACTIVE port (or the one `GW_IB_HCA` names) → the port's GID table
//! from sysfs → [`choose_gid`]. Every step's choice is made by a pure
//! function in `port.rs` or `gid.rs`; this file only asks the device and
//! turns its structs into those types. A machine without a device, or
//! without InfiniBand support in its kernel, fails at the first call with
//! [`Error::NoDevice`] carrying the system's own reason.

use crate::config::Config;
use crate::error::{Errno, Error, Result};
use crate::gid::{GidChoice, choose_gid, read_gid_table};
use crate::port::{LinkLayer, Mtu, PortInfo, PortState, choose_port, select_device};
use crate::qp_plan::{DeviceLimits, LocalPath};
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// An open device context; closed when the last holder drops it.
pub(crate) struct Context {
    pub(crate) ctx: *mut rdma_sys::ibv_context,
    pub(crate) name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (the library is
// thread-safe and serialises what needs it); this wrapper hands out no
// references into the C struct.
unsafe impl Send for Context {}
// SAFETY: as for Send: every use goes through libibverbs calls, which are
// thread-safe on one context.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from ibv_open_device and every object made from it
        // holds an Arc of this Context, so none is left when this runs.
        let rc = unsafe { rdma_sys::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, "ibv_close_device failed: {}", Errno::last());
        }
    }
}

/// `ibv_get_device_list`'s result, freed on drop.
struct DeviceList {
    list: *mut *mut rdma_sys::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: n is a valid out-pointer; a NULL result sets errno.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let errno = Errno::last();
            return Err(Error::NoDevice {
                reason: if errno.0 == 0 {
                    "ibv_get_device_list failed without saying why".into()
                } else {
                    errno.text()
                },
            });
        }
        let list = DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        };
        if list.len == 0 {
            return Err(Error::NoDevice {
                reason: "no devices found".into(),
            });
        }
        Ok(list)
    }

    fn device(&self, i: usize) -> *mut rdma_sys::ibv_device {
        assert!(i < self.len);
        // SAFETY: the list holds len device pointers (ibv_get_device_list's
        // contract), and i < len.
        unsafe { *self.list.add(i) }
    }

    fn names(&self) -> Vec<String> {
        (0..self.len)
            .map(|i| {
                // SAFETY: a device of the list, which is still alive.
                let p = unsafe { rdma_sys::ibv_get_device_name(self.device(i)) };
                if p.is_null() {
                    format!("device {i}")
                } else {
                    // SAFETY: a NUL-terminated name owned by the device.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            })
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: list came from ibv_get_device_list; opened contexts stay
        // valid after it is freed.
        unsafe { rdma_sys::ibv_free_device_list(self.list) };
    }
}

/// The names of the RDMA devices on this machine, in libibverbs' order.
pub fn device_names() -> Result<Vec<String>> {
    Ok(DeviceList::get()?.names())
}

/// An opened device with the port and GID gradwire uses on it.
pub struct Hca {
    pub(crate) ctx: Arc<Context>,
    port: PortInfo,
    gid: GidChoice,
    limits: DeviceLimits,
}

impl std::fmt::Debug for Hca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hca")
            .field("device", &self.ctx.name)
            .field("port", &self.port)
            .field("gid", &self.gid)
            .finish()
    }
}

/// Opens the device `cfg` asks for (the first by default), chooses its port
/// and GID, and logs the choice.
pub fn open(cfg: &Config) -> Result<Hca> {
    let list = DeviceList::get()?;
    let names = list.names();
    let i = select_device(&names, cfg.hca.device.as_deref())?;
    let name = names[i].clone();
    // SAFETY: a device of the live list.
    let raw = unsafe { rdma_sys::ibv_open_device(list.device(i)) };
    if raw.is_null() {
        return Err(Error::OpenDevice {
            call: "ibv_open_device",
            device: name,
            errno: Errno::last(),
        });
    }
    let ctx = Arc::new(Context { ctx: raw, name });
    drop(list);

    let mut attr = MaybeUninit::<rdma_sys::ibv_device_attr>::zeroed();
    // SAFETY: ctx is open and attr is a writable ibv_device_attr.
    let rc = unsafe { rdma_sys::ibv_query_device(ctx.ctx, attr.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::QueryDevice {
            call: "ibv_query_device",
            device: ctx.name.clone(),
            errno: crate::sys::rc_errno(rc),
        });
    }
    // SAFETY: ibv_query_device succeeded and filled it (it was zeroed before).
    let attr = unsafe { attr.assume_init() };
    let ports = (1..=attr.phys_port_cnt)
        .map(|p| query_port(&ctx, p))
        .collect::<Result<Vec<_>>>()?;
    let port = choose_port(&ctx.name, &ports, cfg.hca.port)?.clone();
    let table = read_gid_table(
        &cfg.sysfs,
        &ctx.name,
        port.num,
        port.link_layer,
        port.gid_table_len,
    )?;
    let gid = choose_gid(port.link_layer, &table, cfg.gid_index)?;
    if gid.index > u32::from(u8::MAX) {
        return Err(Error::NoGid {
            why: format!(
                "GID index {} does not fit the 8 bits verbs address it with",
                gid.index
            ),
        });
    }
    tracing::info!(
        device = %ctx.name,
        port = port.num,
        link = %port.link_layer,
        mtu = %port.active_mtu,
        lid = port.lid,
        "verbs: {}",
        gid.reason
    );
    let count = |v: i32| u32::try_from(v).unwrap_or(0);
    let limits = DeviceLimits {
        max_cqe: count(attr.max_cqe),
        max_srq_wr: count(attr.max_srq_wr),
        max_qp_rd_atom: count(attr.max_qp_rd_atom),
        max_qp_init_rd_atom: count(attr.max_qp_init_rd_atom),
        max_msg_sz: port_max_msg(&ctx, port.num)?,
    };
    Ok(Hca {
        ctx,
        port,
        gid,
        limits,
    })
}

/// The largest message port `num` carries.
fn port_max_msg(ctx: &Context, num: u8) -> Result<u32> {
    Ok(port_attr(ctx, num)?.max_msg_sz)
}

fn query_port(ctx: &Context, num: u8) -> Result<PortInfo> {
    let a = port_attr(ctx, num)?;
    Ok(PortInfo {
        num,
        state: PortState::from_code(a.state),
        link_layer: LinkLayer::from_code(a.link_layer).unwrap_or(LinkLayer::Infiniband),
        // A port that is not up may report 0; the smallest MTU is safe then.
        active_mtu: Mtu::from_code(a.active_mtu).unwrap_or(Mtu::B256),
        lid: a.lid,
        gid_table_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
    })
}

fn port_attr(ctx: &Context, num: u8) -> Result<rdma_sys::ibv_port_attr> {
    let mut attr = MaybeUninit::<rdma_sys::ibv_port_attr>::zeroed();
    // SAFETY: ctx is open and attr is a writable, zeroed ibv_port_attr;
    // ___ibv_query_port is what the C macro ibv_query_port expands to.
    let rc = unsafe { rdma_sys::___ibv_query_port(ctx.ctx, num, attr.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::QueryPort {
            call: "ibv_query_port",
            device: ctx.name.clone(),
            port: num,
            errno: crate::sys::rc_errno(rc),
        });
    }
    // SAFETY: the query succeeded and filled the struct (zeroed before).
    Ok(unsafe { attr.assume_init() })
}

impl Hca {
    /// What the device and its port allow.
    pub fn limits(&self) -> &DeviceLimits {
        &self.limits
    }

    /// The device's name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    /// The port in use.
    pub fn port(&self) -> &PortInfo {
        &self.port
    }

    /// The GID in use, and why.
    pub fn gid(&self) -> &GidChoice {
        &self.gid
    }

    /// This side of every queue pair made on this device.
    pub fn local_path(&self) -> LocalPath {
        LocalPath {
            port: self.port.num,
            link_layer: self.port.link_layer,
            mtu: self.port.active_mtu,
            lid: self.port.lid,
            // Checked to fit at open.
            gid_index: u8::try_from(self.gid.index).unwrap_or(0),
            gid: self.gid.gid,
        }
    }
}
