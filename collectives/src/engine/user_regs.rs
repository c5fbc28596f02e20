//! Buffers the caller registered once (NCCL's `ncclCommRegister`): an
//! ordinary operation whose send or receive buffer lies inside one uses
//! that registration instead of registering and deregistering its own.
//!
//! Why explicit: on an RDMA device, registering pins pages and costs tens
//! of microseconds, so registering every call's buffers wastes most of a
//! small message's time. A cache that registers on its own would need to
//! see the caller free memory (a freed buffer whose address is reused would
//! be reached through the stale, still-pinned pages); gradwire cannot see
//! that, so the caller says which memory lives long enough, and promises
//! to keep it until it deregisters. Persistent operations register their
//! own buffers once (`prepared.rs`) and do not look here.
//!
//! Only transports whose registration pins memory (`Properties::
//! pins_memory`: the NIC transports) lend caller registrations; on TCP and
//! shm a registration is a table entry, and shm sizes its copies by the
//! region a receive lands in, which must stay the operation's own buffer.
//!
//! Registering goes through the mailbox and runs as soon as the engine
//! takes it (`Plan::Register`): an operation that has its memory already
//! keeps it, later ones borrow. Deregistering (`Plan::Deregister`) runs in
//! order and carries the range, so it waits for earlier operations on that
//! memory; a registration still lent (it cannot be, barring a bug) is
//! refused rather than pulled from under a transfer, and stays registered.
//! Empty buffers never borrow: they share one empty registration per
//! transport, made once.

use super::Ptr;
use super::{Engine, REGISTRATIONS, Running};
use gw_transport::{Error, MemHandle, Result, Transport};
use std::sync::atomic::Ordering;

/// The caller's registrations, and what each transport does with them.
pub(super) struct UserRegs {
    regs: Vec<UserReg>,
    /// Per transport: whether it lends caller registrations (see above).
    pins: Vec<bool>,
    /// Per transport: the one registration of empty buffers.
    empty: Vec<Option<MemHandle>>,
}

impl UserRegs {
    pub fn new(transports: &[Box<dyn Transport>]) -> UserRegs {
        UserRegs {
            regs: Vec::new(),
            pins: transports
                .iter()
                .map(|t| t.properties().pins_memory)
                .collect(),
            empty: vec![None; transports.len()],
        }
    }
}

/// One caller registration, with every transport.
struct UserReg {
    id: u64,
    ptr: usize,
    len: usize,
    handles: Vec<Option<MemHandle>>,
    /// Operations in flight that use it.
    lent: usize,
}

/// An operation's buffer as one transport reaches it: the handle, where
/// the buffer starts inside the handle's region, and whose handle it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mem {
    pub handle: MemHandle,
    pub offset: usize,
    pub whose: Whose,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Whose {
    /// Registered for this operation; deregistered when it ends.
    Own,
    /// A caller registration's (its id): given back when it ends.
    User(u64),
    /// A persistent operation's, lent for a round.
    Lent,
}

/// An operation's send and receive buffers on one transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OpMem {
    pub send: Mem,
    pub recv: Mem,
}

impl OpMem {
    /// A persistent operation's registrations, lent for one round.
    pub fn lent(send: MemHandle, recv: MemHandle) -> OpMem {
        let m = |handle| Mem {
            handle,
            offset: 0,
            whose: Whose::Lent,
        };
        OpMem {
            send: m(send),
            recv: m(recv),
        }
    }
}

impl UserReg {
    /// Whether `len > 0` bytes at `ptr` lie inside it.
    fn holds(&self, ptr: usize, len: usize) -> bool {
        len > 0 && ptr >= self.ptr && ptr.saturating_add(len) <= self.ptr.saturating_add(self.len)
    }
}

impl Engine {
    /// `Plan::Register`: registers `[ptr, ptr + len)` with every transport
    /// under `id`.
    pub(super) fn register_user(&mut self, id: u64, ptr: Ptr, len: usize) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(super::failed_earlier(e));
        }
        let mut handles = Vec::with_capacity(self.transports.len());
        for t in 0..self.transports.len() {
            // SAFETY: the caller of `Communicator::register_raw` keeps the
            // memory allocated until it deregisters.
            match unsafe { self.transports[t].register(ptr.0, len) } {
                Ok(h) => handles.push(Some(h)),
                Err(e) => {
                    for (t, h) in handles.into_iter().enumerate() {
                        if let Some(h) = h {
                            let _ = self.transports[t].deregister(h);
                        }
                    }
                    return Err(e);
                }
            }
            REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        }
        self.user_regs.regs.push(UserReg {
            id,
            ptr: ptr.0 as usize,
            len,
            handles,
            lent: 0,
        });
        Ok(())
    }

    /// `Plan::Deregister`: withdraws registration `id`, unless an operation
    /// in flight still uses it.
    pub(super) fn deregister_user(&mut self, id: u64) -> Result<()> {
        let i = self
            .user_regs
            .regs
            .iter()
            .position(|u| u.id == id)
            .ok_or_else(|| Error::InvalidUsage(format!("registration {id} is not registered")))?;
        let u = &self.user_regs.regs[i];
        if u.lent > 0 {
            return Err(Error::InvalidUsage(format!(
                "deregister: {} operation(s) in flight still use the {} bytes at {:#x}; \
                 wait for them first",
                u.lent, u.len, u.ptr
            )));
        }
        let u = self.user_regs.regs.swap_remove(i);
        let mut res = Ok(());
        for (t, h) in u.handles.into_iter().enumerate() {
            if let Some(h) = h
                && let Err(e) = self.transports[t].deregister(h)
            {
                res = res.and(Err(e));
            }
        }
        res
    }

    /// How transport `t` reaches `len` bytes at `ptr` for an operation: a
    /// caller registration holding them where `t` lends those, the shared
    /// empty registration for no bytes, else a registration of its own.
    pub(super) fn mem_for(&mut self, t: usize, ptr: *mut u8, len: usize) -> Result<Mem> {
        let at = ptr as usize;
        if len == 0 {
            let handle = match self.user_regs.empty[t] {
                Some(h) => h,
                None => {
                    // SAFETY: no bytes: nothing is ever read or written.
                    let h = unsafe { self.transports[t].register(std::ptr::null_mut(), 0)? };
                    REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
                    self.user_regs.empty[t] = Some(h);
                    h
                }
            };
            return Ok(Mem {
                handle,
                offset: 0,
                whose: Whose::Lent,
            });
        }
        let lends = self.user_regs.pins.get(t).copied().unwrap_or(false);
        if lends
            && let Some(u) = self.user_regs.regs.iter_mut().find(|u| u.holds(at, len))
            && let Some(handle) = u.handles.get(t).copied().flatten()
        {
            u.lent += 1;
            return Ok(Mem {
                handle,
                offset: at - u.ptr,
                whose: Whose::User(u.id),
            });
        }
        // SAFETY: the operation's caller keeps its buffers valid until it
        // completes; they are deregistered in `give_back` before that.
        let handle = unsafe { self.transports[t].register(ptr, len)? };
        REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        Ok(Mem {
            handle,
            offset: 0,
            whose: Whose::Own,
        })
    }

    /// The running operation's buffers on transport `t`, registered (or
    /// found) when first used.
    pub(super) fn op_mem(&mut self, r: &mut Running, t: usize) -> Result<OpMem> {
        if let Some(m) = r.handles[t] {
            return Ok(m);
        }
        let send = self.mem_for(t, r.op.send.0, r.op.send_bytes)?;
        let recv = match self.mem_for(t, r.op.recv.0, r.op.recv_bytes) {
            Ok(m) => m,
            Err(e) => {
                self.give_back(t, send);
                return Err(e);
            }
        };
        let m = OpMem { send, recv };
        r.handles[t] = Some(m);
        Ok(m)
    }

    /// An operation is done with `m` on transport `t`.
    pub(super) fn give_back(&mut self, t: usize, m: Mem) {
        match m.whose {
            Whose::Own => {
                let _ = self.transports[t].deregister(m.handle);
            }
            Whose::User(id) => {
                if let Some(u) = self.user_regs.regs.iter_mut().find(|u| u.id == id) {
                    u.lent = u.lent.saturating_sub(1);
                }
            }
            Whose::Lent => {}
        }
    }
}
