//! The C ABI over gw-collectives: `libgradwire.so` / `libgradwire.a` and
//! `include/gradwire.h` (generated from `src/` by cbindgen in `build.rs`).
//!
//! Every entry point catches panics (returning `gwInternalError`), validates
//! its pointers and enum values (taken as raw integers), and looks its
//! communicator up in a registry of live handles, so that a destroyed or bogus
//! handle is `gwInvalidUsage`, never a crash. Handles are opaque numbers that
//! are never reused and never dereferenced.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::missing_safety_doc
)]

use gw_collectives::{
    CommKey, Communicator, Config, Handle, LaunchEnv, OpKind, RawOp, RawPersistent, TransportChoice,
};
use gw_collectives::{DType, RawSharedAllReduce, RedOp};
use gw_rendezvous::launch_env::Launcher;
use gw_rendezvous::{StoreConfig, StoreServer};
use gw_transport::Error;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod cuda;
mod cuda_persistent;
pub mod device;
mod register;
pub mod step;

/// Library version, `major * 10000 + minor * 100 + patch`.
pub const GW_VERSION_CODE: c_int = 100;
/// Value of `gwConfig_t.magic`.
pub const GW_CONFIG_MAGIC: u32 = 0x6777_6366;
/// Current layout version of `gwConfig_t`.
pub const GW_CONFIG_VERSION: u32 = 1;
/// Bytes of a `gwUniqueId`.
pub const GW_UNIQUE_ID_BYTES: usize = 128;

/// Result codes of every call.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gwResult_t {
    /// The call succeeded.
    gwSuccess = 0,
    /// An argument is unusable: null pointer, unknown enum value, count overflow, root out of range.
    gwInvalidArgument = 1,
    /// The call is not allowed now: destroyed or unknown communicator or request, freed
    /// request, wrong state (`gwStart` on a running request).
    gwInvalidUsage = 2,
    /// A system call failed (the message names it).
    gwSystemError = 3,
    /// Another rank failed, died, or disagrees about the operation (the message names it).
    gwRemoteError = 4,
    /// A deadline passed (`GW_TIMEOUT`, `gwConfig_t.timeout_ms`, or `gwWait`'s timeout).
    gwTimeout = 5,
    /// The communicator was aborted (`gwCommAbort`, or a peer failure).
    gwAborted = 6,
    /// A bug in gradwire, or a configuration/protocol/store error.
    gwInternalError = 7,
    /// `gwStepBegin` only: the job server's scheduling policy takes the job off its
    /// nodes. Save a checkpoint of everything through step `info->step - 1` and exit 0;
    /// the job is started again with `GW_RESUME_STEP` = `info->step`.
    gwPreempted = 8,
}
use gwResult_t::*;

/// Element types. Parameters of this type are validated: another value is `gwInvalidArgument`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum gwDataType_t {
    gwUint8 = 0,
    gwInt32 = 1,
    gwInt64 = 2,
    gwFloat16 = 3,
    gwBfloat16 = 4,
    gwFloat32 = 5,
    gwFloat64 = 6,
}

/// Reduction operators. `gwAvg` is for floating-point types only.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum gwRedOp_t {
    gwSum = 0,
    gwProd = 1,
    gwMin = 2,
    gwMax = 3,
    gwAvg = 4,
}

/// Transport choice of `gwConfig_t.transport`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum gwTransport_t {
    /// Keep the default (`auto`, or `GW_TRANSPORT`).
    gwTransportDefault = -1,
    /// Shared memory to same-host peers, TCP to the rest.
    gwTransportAuto = 0,
    /// TCP to every peer.
    gwTransportTcp = 1,
    /// Shared memory to every peer (an error if a peer is on another host).
    gwTransportShm = 2,
}

/// A `gwDataType_t` as passed by C: any int, validated before use.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct DataTypeArg(pub c_int);

/// A `gwRedOp_t` as passed by C: any int, validated before use.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct RedOpArg(pub c_int);

/// A `gwResult_t` as passed by C: any int.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct ResultArg(pub c_int);

/// Opaque communicator (never dereferenced by the library).
pub enum gwComm {}
/// Opaque request (never dereferenced by the library).
pub enum gwRequest {}
/// A communicator handle.
pub type gwComm_t = *mut gwComm;
/// A request handle of an `...Async` call or of `gwAllReduceInit`.
pub type gwRequest_t = *mut gwRequest;

/// Names a rendezvous for `gwCommInitRank`: made by one process with
/// `gwGetUniqueId` and sent to every rank by the application.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct gwUniqueId {
    pub internal: [c_char; 128],
}

/// Options of `gwCommInitRankConfig`. Initialise with `GW_CONFIG_INITIALIZER`
/// and change only the fields you need: the library reads `size` bytes, so
/// fields added later keep their defaults for old programs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gwConfig_t {
    /// `sizeof(gwConfig_t)`.
    pub size: usize,
    /// `GW_CONFIG_MAGIC`.
    pub magic: u32,
    /// `GW_CONFIG_VERSION`.
    pub version: u32,
    /// Deadline of init and of every operation in milliseconds; <= 0 keeps the default (60 s, or `GW_TIMEOUT`).
    pub timeout_ms: c_int,
    /// A `gwTransport_t` value; `gwTransportDefault` keeps the default.
    pub transport: c_int,
}

// ---------------------------------------------------------------------------
// Registries and errors.

struct CommState {
    comm: Communicator,
    /// Device state: staging buffers, peers' IPC mappings.
    cuda: cuda::CommCuda,
    /// Every message reported for this communicator, kept until destroy so
    /// that pointers returned by `gwGetLastError` stay valid.
    errors: Mutex<Vec<CString>>,
}

struct Request {
    kind: RequestKind,
    comm: Arc<CommState>,
}

enum RequestKind {
    /// An `...Async` call: freed by the `gwWait` that sees it finish.
    Once(Handle),
    /// `gwAllReduceInit`: started by `gwStart` any number of times, freed
    /// only by `gwRequestFree`.
    Persistent(RawPersistent),
    /// `gwAllReduceInit` on device memory.
    Device(cuda_persistent::DevicePersistent),
    /// `gwAllReduceInitShared`: as `Persistent`, on buffers it owns.
    Shared(RawSharedAllReduce),
}

static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

// Ordered maps, not hash maps: every call looks its handle up, and with a
// few handles comparing numbers is cheaper than hashing one (SipHash was
// about 5% of a 4-byte all-reduce's time in the C ABI).
fn comms() -> &'static Mutex<BTreeMap<usize, Arc<CommState>>> {
    static M: OnceLock<Mutex<BTreeMap<usize, Arc<CommState>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn requests() -> &'static Mutex<BTreeMap<usize, Arc<Request>>> {
    static M: OnceLock<Mutex<BTreeMap<usize, Arc<Request>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// Stores started by `gwGetUniqueId`, alive until the process exits.
fn stores() -> &'static Mutex<Vec<StoreServer>> {
    static M: OnceLock<Mutex<Vec<StoreServer>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn new_handle() -> usize {
    // Spaced like pointers; never reused, so a stale handle is always detected.
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) << 4
}

thread_local! {
    static LAST: RefCell<Vec<CString>> = const { RefCell::new(Vec::new()) };
}

const NO_ERROR: &CStr = c"no error";

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

struct Failure {
    code: gwResult_t,
    msg: String,
}

type CResult<T> = Result<T, Failure>;

fn fail<T>(code: gwResult_t, msg: impl Into<String>) -> CResult<T> {
    Err(Failure {
        code,
        msg: msg.into(),
    })
}

fn code_of(e: &Error) -> gwResult_t {
    match e {
        Error::InvalidArgument(_) => gwInvalidArgument,
        Error::InvalidUsage(_) => gwInvalidUsage,
        Error::Sys { .. } => gwSystemError,
        Error::Remote { .. } | Error::Mismatch { .. } => gwRemoteError,
        Error::Timeout { .. } => gwTimeout,
        Error::Aborted(_) => gwAborted,
        _ => gwInternalError,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: code_of(&e),
            msg: e.to_string(),
        }
    }
}

fn record(comm: Option<&CommState>, msg: &str) {
    let c = cstring(msg);
    if let Some(st) = comm {
        let mut v = st.errors.lock().unwrap_or_else(|p| p.into_inner());
        if v.last().map(|l| l.as_c_str()) != Some(c.as_c_str()) {
            v.push(c.clone());
        }
    }
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        if l.last().map(|x| x.as_c_str()) != Some(c.as_c_str()) {
            if l.len() >= 64 {
                l.remove(0);
            }
            l.push(c);
        }
    });
}

/// Runs an entry point's body: catches panics and records failures.
fn guard(comm: gwComm_t, f: impl FnOnce() -> CResult<()>) -> gwResult_t {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        fail(gwInternalError, format!("internal error: panic: {what}"))
    });
    match r {
        Ok(()) => gwSuccess,
        Err(f) => {
            let st = comms()
                .lock()
                .ok()
                .and_then(|m| m.get(&(comm as usize)).cloned());
            record(st.as_deref(), &f.msg);
            f.code
        }
    }
}

fn lookup(comm: gwComm_t) -> CResult<Arc<CommState>> {
    if comm.is_null() {
        return fail(gwInvalidArgument, "invalid argument: comm is NULL");
    }
    let m = comms().lock().unwrap_or_else(|p| p.into_inner());
    match m.get(&(comm as usize)) {
        Some(c) => Ok(c.clone()),
        None => fail(
            gwInvalidUsage,
            format!("invalid usage: communicator {comm:p} was destroyed or never created"),
        ),
    }
}

fn dtype(d: DataTypeArg) -> CResult<DType> {
    match u8::try_from(d.0).ok().and_then(DType::from_code) {
        Some(t) if t != DType::Bytes => Ok(t),
        _ => fail(
            gwInvalidArgument,
            format!("invalid argument: datatype {} is not a gwDataType_t", d.0),
        ),
    }
}

fn redop(o: RedOpArg) -> CResult<RedOp> {
    match u8::try_from(o.0).ok().and_then(RedOp::from_code) {
        Some(r) if r != RedOp::None => Ok(r),
        _ => fail(
            gwInvalidArgument,
            format!("invalid argument: op {} is not a gwRedOp_t", o.0),
        ),
    }
}

fn root_of(root: c_int, st: &CommState) -> CResult<u32> {
    match u32::try_from(root) {
        Ok(r) if r < st.comm.size() => Ok(r),
        _ => fail(
            gwInvalidArgument,
            format!(
                "invalid argument: root {root} is not a rank of this {}-rank communicator",
                st.comm.size()
            ),
        ),
    }
}

fn out<T>(p: *mut T, name: &str) -> CResult<()> {
    if p.is_null() {
        return fail(
            gwInvalidArgument,
            format!("invalid argument: {name} is NULL"),
        );
    }
    Ok(())
}

/// Refuses a count no buffer can hold (before anything is queued).
fn check_count(op: &RawOp) -> CResult<()> {
    if op.count > isize::MAX as usize {
        return fail(
            gwInvalidArgument,
            format!("invalid argument: count {} overflows", op.count),
        );
    }
    Ok(())
}

fn raw(kind: OpKind, dt: DType, op: RedOp, count: usize, send: *const u8, recv: *mut u8) -> RawOp {
    RawOp {
        kind,
        dtype: dt,
        redop: op,
        count,
        root: 0,
        send,
        recv,
        weight: None,
    }
}

/// A reducing collective's operation from the C arguments (every form of
/// all-reduce, reduce-scatter and reduce builds it the same way).
fn reducing(
    kind: OpKind,
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
) -> CResult<RawOp> {
    Ok(raw(
        kind,
        dtype(datatype)?,
        redop(op)?,
        count,
        sendbuff.cast(),
        recvbuff.cast(),
    ))
}

/// A collective that moves data without reducing it (all-gather, broadcast).
fn plain(
    kind: OpKind,
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
) -> CResult<RawOp> {
    Ok(raw(
        kind,
        dtype(datatype)?,
        RedOp::None,
        count,
        sendbuff.cast(),
        recvbuff.cast(),
    ))
}

/// `op` with its root checked against the communicator.
fn rooted(op: CResult<RawOp>, root: c_int, st: &CommState) -> CResult<RawOp> {
    Ok(RawOp {
        root: root_of(root, st)?,
        ..op?
    })
}

/// Runs `op` to completion (blocking form) or hands back a request (async form).
fn run(
    comm: gwComm_t,
    request: Option<*mut gwRequest_t>,
    mk: impl FnOnce(&CommState) -> CResult<RawOp>,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        if let Some(r) = request {
            out(r, "request")?;
            // SAFETY: checked non-null.
            unsafe { *r = std::ptr::null_mut() };
        }
        let op = mk(&st)?;
        check_count(&op)?;
        match request {
            None if cuda::run(&*st, &op, None)? => {}
            Some(_) if cuda::device_given(&*st, &op)? => {
                return fail(
                    gwInvalidArgument,
                    "invalid argument: the ...Async calls take host memory; \
                     for device memory use the blocking or the ...Stream call",
                );
            }
            None => {
                // No registry lock is held while blocking: gwCommAbort can run.
                // SAFETY: the C caller promises the buffers per the header's
                // contract until this call returns.
                unsafe { st.comm.run_raw(op, None)? };
            }
            Some(r) => {
                // SAFETY: as above, until the request completes.
                let h = unsafe { st.comm.submit_raw(op, None)? };
                let id = new_handle();
                requests().lock().unwrap_or_else(|p| p.into_inner()).insert(
                    id,
                    Arc::new(Request {
                        kind: RequestKind::Once(h),
                        comm: st.clone(),
                    }),
                );
                // SAFETY: checked non-null above.
                unsafe { *r = id as gwRequest_t };
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Unique ids.

/// A secret from the kernel's random source; a process that cannot read
/// it gets an error rather than a token someone could guess.
fn random_hex(bytes: usize) -> CResult<String> {
    gw_rendezvous::token::random_hex(bytes).map_err(|e| Failure {
        code: gwSystemError,
        msg: format!("cannot read /dev/urandom for a job token: {e}"),
    })
}

/// The address other hosts use to reach this one: `GW_UNIQUEID_HOST` if set,
/// else the source address of the default route, else 127.0.0.1.
fn advertised_host() -> String {
    if let Ok(h) = std::env::var("GW_UNIQUEID_HOST")
        && !h.trim().is_empty()
    {
        return h.trim().to_string();
    }
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .unwrap_or_else(|| "127.0.0.1".into())
}

struct Decoded {
    store: String,
    token: String,
    job_id: String,
}

fn decode_id(id: &gwUniqueId) -> CResult<Decoded> {
    let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let text = std::str::from_utf8(&bytes[..end]).unwrap_or("");
    let mut parts = text.split('|');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(s), Some(t), Some(j), None) if !s.is_empty() && !t.is_empty() && !j.is_empty() => {
            Ok(Decoded {
                store: s.into(),
                token: t.into(),
                job_id: j.into(),
            })
        }
        _ => fail(
            gwInvalidArgument,
            "invalid argument: uniqueId was not made by gwGetUniqueId",
        ),
    }
}

fn init_rank(
    comm: *mut gwComm_t,
    nranks: c_int,
    id: &gwUniqueId,
    rank: c_int,
    cfg: Config,
) -> CResult<()> {
    out(comm, "comm")?;
    // SAFETY: checked non-null.
    unsafe { *comm = std::ptr::null_mut() };
    let world = u32::try_from(nranks)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Failure {
            code: gwInvalidArgument,
            msg: format!("invalid argument: nranks {nranks} must be positive"),
        })?;
    let me = u32::try_from(rank)
        .ok()
        .filter(|r| *r < world)
        .ok_or_else(|| Failure {
            code: gwInvalidArgument,
            msg: format!("invalid argument: rank {rank} is not in 0..{nranks}"),
        })?;
    let d = decode_id(id)?;
    let key = CommKey::exact(&format!("u{}", d.job_id))?;
    let env = LaunchEnv {
        rank: me,
        world,
        local_rank: me,
        local_size: world,
        store: d.store,
        token: d.token,
        job_id: d.job_id,
        job_server: None,
        launcher: Launcher::Api,
        host_store: false,
    };
    gw_logging::init_if_unset();
    publish(Communicator::init(env, key, cfg)?, comm)
}

fn publish(c: Communicator, comm: *mut gwComm_t) -> CResult<()> {
    let id = new_handle();
    comms().lock().unwrap_or_else(|p| p.into_inner()).insert(
        id,
        Arc::new(CommState {
            comm: c,
            cuda: cuda::CommCuda::default(),
            errors: Mutex::new(Vec::new()),
        }),
    );
    // SAFETY: the callers checked `comm` is non-null.
    unsafe { *comm = id as gwComm_t };
    Ok(())
}

fn config_from(c: *const gwConfig_t) -> CResult<Config> {
    let mut cfg = Config::default();
    if c.is_null() {
        return Ok(cfg);
    }
    // Read only the header first: older callers may pass a shorter struct.
    // SAFETY: non-null; the header fields exist in every version.
    let (size, magic) = unsafe { ((*c).size, (*c).magic) };
    if magic != GW_CONFIG_MAGIC {
        return fail(
            gwInvalidArgument,
            "invalid argument: config was not initialised with GW_CONFIG_INITIALIZER (bad magic)",
        );
    }
    let full = std::mem::size_of::<gwConfig_t>();
    let header = std::mem::offset_of!(gwConfig_t, timeout_ms);
    if size < header {
        return fail(
            gwInvalidArgument,
            format!("invalid argument: config size {size} is too small"),
        );
    }
    let mut v = gwConfig_t {
        size,
        magic,
        version: GW_CONFIG_VERSION,
        timeout_ms: -1,
        transport: gwTransport_t::gwTransportDefault as c_int,
    };
    // SAFETY: copies at most `size` bytes of the caller's struct.
    unsafe {
        std::ptr::copy_nonoverlapping(
            c as *const u8,
            &mut v as *mut gwConfig_t as *mut u8,
            size.min(full),
        )
    };
    if v.timeout_ms > 0 {
        cfg.timeout.set(Duration::from_millis(v.timeout_ms as u64));
    }
    match v.transport {
        -1 => {}
        0 => cfg.transport.set(TransportChoice::Auto),
        1 => cfg.transport.set(TransportChoice::Tcp),
        2 => cfg.transport.set(TransportChoice::Shm),
        t => {
            return fail(
                gwInvalidArgument,
                format!("invalid argument: transport {t} is not a gwTransport_t"),
            );
        }
    }
    Ok(cfg)
}

// ---------------------------------------------------------------------------
// Entry points.

/// Stores `GW_VERSION_CODE` of the loaded library in `*version`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwGetVersion(version: *mut c_int) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        out(version, "version")?;
        // SAFETY: checked non-null.
        unsafe { *version = GW_VERSION_CODE };
        Ok(())
    })
}

/// Under `GW_TRACE`, records a span of the program's own work (a step's
/// forward and backward pass, say) on this rank's `compute` lane of the
/// timeline: it lasted `seconds` and ends now, and `step` goes in its
/// arguments, so the trace shows what the collectives overlapped with. A
/// no-op when tracing is off, but the arguments are checked either way:
/// `name` is 1 to 64 letters, digits and `_ - . : /` (copied; the first 64
/// distinct names are kept, later new ones are recorded as "compute"), and
/// `seconds` is finite, at least 0 and under 86400. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwTraceSpan(name: *const c_char, seconds: f64, step: u64) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        if name.is_null() {
            return fail(gwInvalidArgument, "invalid argument: name is NULL");
        }
        // SAFETY: non-null; the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) };
        let Ok(name) = name.to_str() else {
            return fail(
                gwInvalidArgument,
                "invalid argument: name is not UTF-8 (use letters, digits and _ - . : /)",
            );
        };
        gw_collectives::trace_span_named(name, seconds, step)?;
        Ok(())
    })
}

/// Starts a rendezvous store in this process (alive until the process exits)
/// and describes it in `*uniqueId`: its address, a random job token and a job
/// id. Call it in one process and send the id to every rank (including this
/// one) for `gwCommInitRank`. The advertised address is `GW_UNIQUEID_HOST` if
/// set, else this host's default-route address, else 127.0.0.1. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwGetUniqueId(uniqueId: *mut gwUniqueId) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        out(uniqueId, "uniqueId")?;
        gw_logging::init_if_unset();
        let token = random_hex(16)?;
        let server = StoreServer::start(
            std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            &token,
            StoreConfig::default(),
        )
        .map_err(gw_transport::Error::from)?;
        let port = server.local_addr().port();
        let text = format!(
            "{}:{port}|{token}|capi-{}",
            advertised_host(),
            random_hex(8)?
        );
        if text.len() >= GW_UNIQUE_ID_BYTES {
            return fail(gwInternalError, "internal error: unique id text too long");
        }
        let mut id = gwUniqueId {
            internal: [0; GW_UNIQUE_ID_BYTES],
        };
        for (d, s) in id.internal.iter_mut().zip(text.bytes()) {
            *d = s as c_char;
        }
        stores()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(server);
        // SAFETY: checked non-null.
        unsafe { *uniqueId = id };
        Ok(())
    })
}

/// Creates rank `rank` of an `nranks`-rank communicator that meets at
/// `uniqueId`; blocks until all ranks arrive or the timeout (`GW_TIMEOUT`,
/// default 60 s) passes. `*comm` is NULL on failure (`gwGetLastError(NULL)`
/// tells why). Thread-safe; several ranks may live in one process (one
/// thread each). A unique id names one communicator: get a new one for each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommInitRank(
    comm: *mut gwComm_t,
    nranks: c_int,
    uniqueId: gwUniqueId,
    rank: c_int,
) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        init_rank(comm, nranks, &uniqueId, rank, Config::default())
    })
}

/// As `gwCommInitRank`, with options (`config` may be NULL for defaults).
/// `GW_*` environment variables override `config`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommInitRankConfig(
    comm: *mut gwComm_t,
    nranks: c_int,
    uniqueId: gwUniqueId,
    rank: c_int,
    config: *const gwConfig_t,
) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let cfg = config_from(config)?;
        init_rank(comm, nranks, &uniqueId, rank, cfg)
    })
}

/// Creates a communicator from the variables `gwrun` sets (`GW_RANK`,
/// `GW_WORLD_SIZE`, `GW_STORE`, `GW_TOKEN`, ...; Slurm and torchrun variables
/// work too). `*comm` is NULL on failure. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommInitFromEnv(comm: *mut gwComm_t) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        out(comm, "comm")?;
        // SAFETY: checked non-null.
        unsafe { *comm = std::ptr::null_mut() };
        gw_logging::init_if_unset();
        publish(Communicator::from_env()?, comm)
    })
}

/// This process's rank in `comm`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommRank(comm: gwComm_t, rank: *mut c_int) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(rank, "rank")?;
        // SAFETY: checked non-null.
        unsafe { *rank = st.comm.rank() as c_int };
        Ok(())
    })
}

/// The number of ranks of `comm`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommCount(comm: gwComm_t, count: *mut c_int) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(count, "count")?;
        // SAFETY: checked non-null.
        unsafe { *count = st.comm.size() as c_int };
        Ok(())
    })
}

/// Frees `comm`; the handle is invalid afterwards (later calls with it return
/// `gwInvalidUsage`). Wait for every request of `comm` first: resources are
/// released when the last call or request using it finishes. Thread-safe, but
/// must be the last call on `comm`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommDestroy(comm: gwComm_t) -> gwResult_t {
    guard(comm, || {
        lookup(comm)?;
        let st = comms()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(comm as usize));
        register::forget(comm);
        drop(st);
        Ok(())
    })
}

/// Fails every operation in flight on `comm` and every later one with
/// `gwAborted`, on this rank. Safe to call from any thread, including while
/// another thread blocks in a call on `comm` (that call then returns). Call
/// `gwCommDestroy` afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwCommAbort(comm: gwComm_t) -> gwResult_t {
    guard(comm, || {
        lookup(comm)?.comm.abort();
        Ok(())
    })
}

/// `recvbuff[i] = op over ranks of sendbuff[i]` for `count` elements;
/// in place when `sendbuff == recvbuff`. Blocks until done. Calls on one
/// communicator must be issued in the same order on every rank; several
/// threads may issue calls on one communicator only if they agree on that
/// order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduce(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |_| {
        reducing(OpKind::AllReduce, sendbuff, recvbuff, count, datatype, op)
    })
}

/// `recvbuff[i] = sum over ranks r of weight_r * sendbuff_r[i]`, where
/// `weight` is this rank's factor (e.g. local batch / global batch). Floating
/// types only. In place when `sendbuff == recvbuff`. Blocks; ordering as
/// `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduceWeighted(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    weight: f64,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |_| {
        weighted(sendbuff, recvbuff, count, datatype, weight)
    })
}

fn weighted(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    weight: f64,
) -> CResult<RawOp> {
    Ok(RawOp {
        weight: Some(weight),
        ..raw(
            OpKind::AllReduce,
            dtype(datatype)?,
            RedOp::Sum,
            count,
            sendbuff.cast(),
            recvbuff.cast(),
        )
    })
}

/// Rank r receives block r (of `recvcount` elements) of the reduction of
/// every rank's `sendbuff` (`nranks * recvcount` elements). In place when
/// `recvbuff == sendbuff + rank * recvcount` (elements). Blocks; ordering as
/// `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduceScatter(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    recvcount: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |_| {
        reducing(
            OpKind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
        )
    })
}

/// `recvbuff` (`nranks * sendcount` elements) receives every rank's
/// `sendbuff` in rank order. In place when
/// `sendbuff == recvbuff + rank * sendcount` (elements). Blocks; ordering as
/// `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllGather(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    sendcount: usize,
    datatype: DataTypeArg,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |_| {
        plain(OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype)
    })
}

/// Copies `root`'s `sendbuff` into every rank's `recvbuff` (`sendbuff` is
/// read on the root only). In place when `sendbuff == recvbuff`. Blocks;
/// ordering as `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwBroadcast(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    root: c_int,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |st| {
        rooted(
            plain(OpKind::Broadcast, sendbuff, recvbuff, count, datatype),
            root,
            st,
        )
    })
}

/// Reduces every rank's `sendbuff` into `root`'s `recvbuff` (other ranks'
/// `recvbuff` is unspecified afterwards). In place when `sendbuff == recvbuff`.
/// Blocks; ordering as `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduce(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    root: c_int,
    comm: gwComm_t,
) -> gwResult_t {
    run(comm, None, |st| {
        rooted(
            reducing(OpKind::Reduce, sendbuff, recvbuff, count, datatype, op),
            root,
            st,
        )
    })
}

/// Returns once every rank has called it. Blocks; ordering as `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwBarrier(comm: gwComm_t) -> gwResult_t {
    run(comm, None, |_| {
        Ok(raw(
            OpKind::Barrier,
            DType::U8,
            RedOp::None,
            0,
            std::ptr::null(),
            std::ptr::null_mut(),
        ))
    })
}

/// Runs `op` ordered on a CUDA stream (the `...Stream` calls): it reads
/// the buffers after the work queued before it on `stream`, and work queued
/// after it sees the result. This version returns once the result is in
/// place (later versions may return once it is queued).
fn run_stream(
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
    mk: impl FnOnce(&CommState) -> CResult<RawOp>,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        let op = mk(&st)?;
        check_count(&op)?;
        if cuda::run(&*st, &op, Some(stream))? {
            return Ok(());
        }
        cuda::sync_stream_if_loaded(stream)?;
        // SAFETY: the C caller promises the buffers until this call returns.
        unsafe { st.comm.run_raw(op, None)? };
        Ok(())
    })
}

/// `gwAllReduce` ordered on CUDA stream `stream` (a `cudaStream_t`; NULL is
/// the default stream), as `ncclAllReduce`: `sendbuff` is read after the
/// work queued before the call on `stream`, and work queued after it sees
/// `recvbuff`. Buffers may be device or host memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduceStream(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    run_stream(comm, stream, |_| {
        reducing(OpKind::AllReduce, sendbuff, recvbuff, count, datatype, op)
    })
}

/// `gwReduceScatter` ordered on `stream`, as `gwAllReduceStream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduceScatterStream(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    recvcount: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    run_stream(comm, stream, |_| {
        reducing(
            OpKind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
        )
    })
}

/// `gwAllGather` ordered on `stream`, as `gwAllReduceStream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllGatherStream(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    sendcount: usize,
    datatype: DataTypeArg,
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    run_stream(comm, stream, |_| {
        plain(OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype)
    })
}

/// `gwBroadcast` ordered on `stream`, as `gwAllReduceStream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwBroadcastStream(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    root: c_int,
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    run_stream(comm, stream, |st| {
        rooted(
            plain(OpKind::Broadcast, sendbuff, recvbuff, count, datatype),
            root,
            st,
        )
    })
}

/// `gwReduce` ordered on `stream`, as `gwAllReduceStream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduceStream(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    root: c_int,
    comm: gwComm_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    run_stream(comm, stream, |st| {
        rooted(
            reducing(OpKind::Reduce, sendbuff, recvbuff, count, datatype, op),
            root,
            st,
        )
    })
}

/// Starts `gwAllReduce` and returns at once with `*request`; the buffers must
/// stay valid and untouched until `gwWait` returns. Ordering as `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduceAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |_| {
        reducing(OpKind::AllReduce, sendbuff, recvbuff, count, datatype, op)
    })
}

/// Non-blocking `gwAllReduceWeighted` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduceWeightedAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    weight: f64,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |_| {
        weighted(sendbuff, recvbuff, count, datatype, weight)
    })
}

/// Non-blocking `gwReduceScatter` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduceScatterAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    recvcount: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |_| {
        reducing(
            OpKind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
        )
    })
}

/// Non-blocking `gwAllGather` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllGatherAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    sendcount: usize,
    datatype: DataTypeArg,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |_| {
        plain(OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype)
    })
}

/// Non-blocking `gwBroadcast` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwBroadcastAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    root: c_int,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |st| {
        rooted(
            plain(OpKind::Broadcast, sendbuff, recvbuff, count, datatype),
            root,
            st,
        )
    })
}

/// Non-blocking `gwReduce` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwReduceAsync(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    root: c_int,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run(comm, Some(request), |st| {
        rooted(
            reducing(OpKind::Reduce, sendbuff, recvbuff, count, datatype, op),
            root,
            st,
        )
    })
}

/// Non-blocking `gwBarrier` (see `gwAllReduceAsync`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwBarrierAsync(comm: gwComm_t, request: *mut gwRequest_t) -> gwResult_t {
    run(comm, Some(request), |_| {
        Ok(raw(
            OpKind::Barrier,
            DType::U8,
            RedOp::None,
            0,
            std::ptr::null(),
            std::ptr::null_mut(),
        ))
    })
}

// ---------------------------------------------------------------------------
// Point-to-point.

/// One direction of a point-to-point call, checked.
fn p2p_peer(peer: c_int, st: &CommState, what: &str) -> CResult<u32> {
    match u32::try_from(peer) {
        Ok(p) if p < st.comm.size() => Ok(p),
        _ => fail(
            gwInvalidArgument,
            format!(
                "invalid argument: {what} rank {peer}, which is not a rank of this {}-rank communicator",
                st.comm.size()
            ),
        ),
    }
}

fn p2p_buf<T>(p: *const T, count: usize, name: &str) -> CResult<()> {
    if p.is_null() && count > 0 {
        return fail(
            gwInvalidArgument,
            format!("invalid argument: {name} is NULL with count {count}"),
        );
    }
    if count > isize::MAX as usize {
        return fail(
            gwInvalidArgument,
            format!("invalid argument: count {count} overflows"),
        );
    }
    Ok(())
}

type SendHalf = Option<(u32, *const u8, usize)>;
type RecvHalf = Option<(u32, *mut u8, usize)>;

fn send_half(
    st: &CommState,
    buf: *const std::ffi::c_void,
    count: usize,
    peer: c_int,
) -> CResult<SendHalf> {
    p2p_buf(buf, count, "sendbuff")?;
    Ok(Some((p2p_peer(peer, st, "send to")?, buf.cast(), count)))
}

fn recv_half(
    st: &CommState,
    buf: *mut std::ffi::c_void,
    count: usize,
    peer: c_int,
) -> CResult<RecvHalf> {
    p2p_buf(buf.cast_const(), count, "recvbuff")?;
    Ok(Some((
        p2p_peer(peer, st, "receive from")?,
        buf.cast(),
        count,
    )))
}

/// A send and/or a receive, blocking or as a request (see [`run`]).
fn run_p2p(
    comm: gwComm_t,
    request: Option<*mut gwRequest_t>,
    mk: impl FnOnce(&CommState) -> CResult<(DType, SendHalf, RecvHalf)>,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        if let Some(r) = request {
            out(r, "request")?;
            // SAFETY: checked non-null.
            unsafe { *r = std::ptr::null_mut() };
        }
        let (dt, mut send, mut recv) = mk(&st)?;
        // Device buffers go through pinned host memory (blocking calls only).
        let staged = cuda::stage_p2p(&*st, dt, &mut send, &mut recv, request.is_some())?;
        // SAFETY: the C caller promises the buffers per the header's
        // contract until the call (or the request) completes.
        let h = unsafe { st.comm.sendrecv_raw(dt, send, recv)? };
        match request {
            None => {
                h.wait()?;
                if let Some(s) = staged {
                    s.finish()?;
                }
            }
            Some(r) => {
                let id = new_handle();
                requests().lock().unwrap_or_else(|p| p.into_inner()).insert(
                    id,
                    Arc::new(Request {
                        kind: RequestKind::Once(h),
                        comm: st.clone(),
                    }),
                );
                // SAFETY: checked non-null above.
                unsafe { *r = id as gwRequest_t };
            }
        }
        Ok(())
    })
}

/// Sends `count` elements of `sendbuff` to rank `peer`, which receives them
/// with `gwRecv` (or `gwRecvAsync`). Messages between two ranks are matched
/// in the order each side posts them, per direction; the count and datatype
/// must agree with the receive's. Blocks until the data has left
/// `sendbuff`, which for a large message means until the peer has posted
/// its receive (see `gwSendAsync` on ordering; `gwSendRecv` exchanges).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwSend(
    sendbuff: *const std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    peer: c_int,
    comm: gwComm_t,
) -> gwResult_t {
    run_p2p(comm, None, |st| {
        Ok((
            dtype(datatype)?,
            send_half(st, sendbuff, count, peer)?,
            None,
        ))
    })
}

/// Receives exactly `count` elements from rank `peer` into `recvbuff` (see
/// `gwSend`). Blocks until they have arrived.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwRecv(
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    peer: c_int,
    comm: gwComm_t,
) -> gwResult_t {
    run_p2p(comm, None, |st| {
        Ok((
            dtype(datatype)?,
            None,
            recv_half(st, recvbuff, count, peer)?,
        ))
    })
}

/// Sends `sendcount` elements of `sendbuff` to rank `dest` while receiving
/// `recvcount` elements from rank `source` into `recvbuff`, as one operation
/// (`MPI_Sendrecv`): the way to exchange along a ring or with a partner
/// whatever the message size. Blocks until both are done.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gwSendRecv(
    sendbuff: *const std::ffi::c_void,
    sendcount: usize,
    dest: c_int,
    recvbuff: *mut std::ffi::c_void,
    recvcount: usize,
    source: c_int,
    datatype: DataTypeArg,
    comm: gwComm_t,
) -> gwResult_t {
    run_p2p(comm, None, |st| {
        Ok((
            dtype(datatype)?,
            send_half(st, sendbuff, sendcount, dest)?,
            recv_half(st, recvbuff, recvcount, source)?,
        ))
    })
}

/// Non-blocking `gwSend`: `sendbuff` must not change until `gwWait` (or a
/// `gwTest` that says done) on `*request`. Point-to-point requests start as
/// soon as they are posted, beside collectives and each other, so two ranks
/// may each post a large send before their receive (as MPI's `Isend` then
/// `Irecv`); messages between a pair still match in posting order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwSendAsync(
    sendbuff: *const std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    peer: c_int,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run_p2p(comm, Some(request), |st| {
        Ok((
            dtype(datatype)?,
            send_half(st, sendbuff, count, peer)?,
            None,
        ))
    })
}

/// Non-blocking `gwRecv`: `recvbuff` holds the data once `gwWait` (or a
/// `gwTest` that says done) on `*request` returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwRecvAsync(
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    peer: c_int,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    run_p2p(comm, Some(request), |st| {
        Ok((
            dtype(datatype)?,
            None,
            recv_half(st, recvbuff, count, peer)?,
        ))
    })
}

/// Every rank sends block p of `sendbuff` (`count` elements at element
/// `p * count`) to rank p, and receives rank q's block into block q of
/// `recvbuff`: both hold `count * nranks` elements and must not overlap.
/// Blocks; collective, ordered like `gwAllReduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllToAll(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    comm: gwComm_t,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        let dt = dtype(datatype)?;
        let n = st.comm.size() as usize;
        let counts = vec![count; n];
        let displs: Vec<usize> = (0..n)
            .map(|p| p.checked_mul(count))
            .collect::<Option<_>>()
            .map_or_else(
                || {
                    fail(
                        gwInvalidArgument,
                        format!("invalid argument: count {count} overflows"),
                    )
                },
                Ok,
            )?;
        // SAFETY: the C caller promises both buffers hold count * nranks
        // elements until this returns; the core checks overlap and NULL.
        unsafe {
            st.comm.all_to_allv_raw(
                dt,
                sendbuff.cast(),
                &counts,
                &displs,
                recvbuff.cast(),
                &counts,
                &displs,
            )?
        };
        Ok(())
    })
}

/// `MPI_Alltoallv`: rank p gets `sendcounts[p]` elements from element
/// `sdispls[p]` of `sendbuff`, and this rank receives `recvcounts[q]`
/// elements from rank q at element `rdispls[q]` of `recvbuff`. The four
/// arrays hold nranks entries; what rank p sends rank q must be what q
/// expects from p. Blocks; collective, ordered like `gwAllReduce`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gwAllToAllv(
    sendbuff: *const std::ffi::c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut std::ffi::c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: DataTypeArg,
    comm: gwComm_t,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        let dt = dtype(datatype)?;
        let n = st.comm.size() as usize;
        let arr = |p: *const usize, name: &str| -> CResult<&[usize]> {
            if p.is_null() {
                return fail(
                    gwInvalidArgument,
                    format!("invalid argument: {name} is NULL"),
                );
            }
            // SAFETY: the caller promises nranks entries.
            Ok(unsafe { std::slice::from_raw_parts(p, n) })
        };
        let (sc, sd) = (arr(sendcounts, "sendcounts")?, arr(sdispls, "sdispls")?);
        let (rc, rd) = (arr(recvcounts, "recvcounts")?, arr(rdispls, "rdispls")?);
        // SAFETY: the C caller promises the blocks are valid until this returns.
        unsafe {
            st.comm
                .all_to_allv_raw(dt, sendbuff.cast(), sc, sd, recvbuff.cast(), rc, rd)?
        };
        Ok(())
    })
}

fn lookup_request(request: gwRequest_t) -> CResult<Arc<Request>> {
    if request.is_null() {
        return fail(gwInvalidArgument, "invalid argument: request is NULL");
    }
    let m = requests().lock().unwrap_or_else(|p| p.into_inner());
    match m.get(&(request as usize)) {
        Some(r) => Ok(r.clone()),
        None => fail(
            gwInvalidUsage,
            format!(
                "invalid usage: request {request:p} was already freed (by gwWait or \
                 gwRequestFree) or never created"
            ),
        ),
    }
}

/// Records a finished request's failure on its communicator.
fn finish(r: &Request, res: gw_transport::Result<()>) -> CResult<()> {
    res.map_err(|e| {
        let f = Failure::from(e);
        record(Some(&r.comm), &f.msg);
        f
    })
}

fn free_request(request: gwRequest_t) {
    requests()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(request as usize));
}

/// Sets `*done` to 1 if the request's operation finished, else 0, without
/// blocking. When it finished with an error, that error is returned (and
/// `*done` is 1). Does not free the request: call `gwWait` for that (it then
/// returns at once). On a persistent request (`gwAllReduceInit`) it tests
/// the round begun by the last `gwStart`; with no round running (none
/// started, or its end already reported), `*done` is 1 and it returns
/// `gwSuccess`. Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwTest(request: gwRequest_t, done: *mut c_int) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let r = lookup_request(request)?;
        out(done, "done")?;
        let res = match &r.kind {
            RequestKind::Once(h) => h.test(),
            RequestKind::Persistent(p) => match p.test(&r.comm.comm) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            },
            RequestKind::Shared(p) => match p.test(&r.comm.comm) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            },
            RequestKind::Device(d) => {
                // A wait of no time: asks once, and forgets a finished round.
                let finished = d.wait(Some(Duration::ZERO))?;
                // SAFETY: checked non-null.
                unsafe { *done = finished as c_int };
                return Ok(());
            }
        };
        // SAFETY: checked non-null.
        unsafe { *done = res.is_some() as c_int };
        match res {
            None => Ok(()),
            Some(res) => finish(&r, res),
        }
    })
}

/// Waits for the request's operation at most `timeout_ms` milliseconds
/// (a negative value waits without limit; the operation's own deadline,
/// `GW_TIMEOUT`, still applies). Returns `gwTimeout` if it is still running
/// (the request stays valid), else the operation's result; in that case the
/// request of an `...Async` call is freed (on success and on failure) and
/// must not be used again. A persistent request (`gwAllReduceInit`) is not
/// freed: it waits for the round begun by the last `gwStart` (at once, with
/// `gwSuccess`, when none is running) and stays valid for the next
/// `gwStart`; free it with `gwRequestFree`. Thread-safe, but only one thread
/// may wait on a request.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwWait(request: gwRequest_t, timeout_ms: c_int) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let r = lookup_request(request)?;
        let limit = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let res = match (&r.kind, limit) {
            (RequestKind::Once(h), None) => Some(h.wait()),
            (RequestKind::Once(h), Some(t)) => h.wait_timeout(t),
            (RequestKind::Persistent(p), None) => Some(p.wait(&r.comm.comm)),
            (RequestKind::Persistent(p), Some(t)) => match p.wait_timeout(&r.comm.comm, t) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            },
            (RequestKind::Device(d), limit) => d.wait(limit)?.then_some(Ok(())),
            (RequestKind::Shared(p), None) => Some(p.wait(&r.comm.comm)),
            (RequestKind::Shared(p), Some(t)) => match p.wait_timeout(&r.comm.comm, t) {
                Ok(false) => None,
                Ok(true) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            },
        };
        match res {
            None => {
                let msg = format!("timeout: request still running after gwWait's {timeout_ms} ms");
                record(Some(&r.comm), &msg);
                fail(gwTimeout, msg)
            }
            Some(res) => {
                if matches!(r.kind, RequestKind::Once(_)) {
                    free_request(request);
                }
                finish(&r, res)
            }
        }
    })
}

/// Plans a persistent `gwAllReduce` (MPI's `MPI_Allreduce_init`) of `count`
/// elements of `sendbuff` into `recvbuff` (in place when they are equal) and
/// stores its request in `*request` (NULL on failure). Everything that can be
/// done once is done now: the arguments are checked, the algorithm chosen,
/// the schedule built and kept, both buffers registered with every
/// transport, scratch grown, and the connections to every peer the
/// schedule needs made. Each `gwStart` then runs one round on the same
/// buffers without allocating, registering, connecting or building
/// anything. Collective: every rank calls it, in the same order as its other
/// calls on `comm` (ordering as `gwAllReduce`), and rounds must be started
/// in the same order on every rank too. The buffers must stay valid until
/// `gwRequestFree` returns, and must not be touched while a round runs.
/// Arguments are checked as by `gwAllReduce` (NULL buffers with `count` >
/// 0, unknown `datatype` or `op`, overflowing counts are
/// `gwInvalidArgument`; `count` 0 is allowed). Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwAllReduceInit(
    sendbuff: *const std::ffi::c_void,
    recvbuff: *mut std::ffi::c_void,
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    comm: gwComm_t,
    request: *mut gwRequest_t,
) -> gwResult_t {
    guard(comm, || {
        let st = lookup(comm)?;
        out(request, "request")?;
        // SAFETY: checked non-null.
        unsafe { *request = std::ptr::null_mut() };
        let op = raw(
            OpKind::AllReduce,
            dtype(datatype)?,
            redop(op)?,
            count,
            sendbuff.cast(),
            recvbuff.cast(),
        );
        check_count(&op)?;
        let kind = match cuda_persistent::DevicePersistent::init(&*st, &op)? {
            Some(d) => RequestKind::Device(d),
            // SAFETY: the C caller promises the buffers per the contract
            // above, until gwRequestFree returns.
            None => RequestKind::Persistent(unsafe { st.comm.prepare_raw(op, None)? }),
        };
        let id = new_handle();
        requests().lock().unwrap_or_else(|p| p.into_inner()).insert(
            id,
            Arc::new(Request {
                kind,
                comm: st.clone(),
            }),
        );
        // SAFETY: checked non-null above.
        unsafe { *request = id as gwRequest_t };
        Ok(())
    })
}

/// Plans a persistent all-reduce of `count` elements of `datatype` on
/// buffers the library allocates, zeroed and aligned to 64 bytes, and
/// stores them in `*sendbuff` and `*recvbuff` (one buffer, in both, when
/// `in_place` is non-zero) and the request in `*request` (all NULL on
/// failure): MPI's `MPI_Win_allocate_shared` memory, or NCCL's
/// `ncclMemAlloc`, for one all-reduce. Where every rank shares this host
/// over shared memory, the buffers of all ranks usually lie in one region
/// every rank maps (the exceptions are listed in
/// `collectives/src/shared_all_reduce.rs`), and a round copies nothing in: each rank reduces its slice of
/// every rank's send buffer straight into every rank's receive buffer.
/// Elsewhere they are private, and rounds run as `gwAllReduceInit`'s.
/// Write the input into `*sendbuff` and read the result from `*recvbuff`
/// only while no round runs; rounds run with `gwStart`, `gwTest` and
/// `gwWait`, and `gwRequestFree` frees the request and its buffers.
/// Collective and ordered as `gwAllReduceInit`. Unknown `datatype` or `op`,
/// an average of integers, NULL out-pointers and overflowing counts are
/// `gwInvalidArgument`; `count` 0 is allowed. Thread-safe.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gwAllReduceInitShared(
    count: usize,
    datatype: DataTypeArg,
    op: RedOpArg,
    in_place: c_int,
    comm: gwComm_t,
    sendbuff: *mut *mut std::ffi::c_void,
    recvbuff: *mut *mut std::ffi::c_void,
    request: *mut gwRequest_t,
) -> gwResult_t {
    guard(comm, || {
        // Every output the caller gave is NULL on any failure, this one's
        // first checks included.
        for p in [sendbuff, recvbuff] {
            if !p.is_null() {
                // SAFETY: non-null, and the caller's to write.
                unsafe { *p = std::ptr::null_mut() };
            }
        }
        if !request.is_null() {
            // SAFETY: as above.
            unsafe { *request = std::ptr::null_mut() };
        }
        let st = lookup(comm)?;
        out(request, "request")?;
        out(sendbuff, "sendbuff")?;
        out(recvbuff, "recvbuff")?;
        let (dt, op) = (dtype(datatype)?, redop(op)?);
        check_count(&raw(
            OpKind::AllReduce,
            dt,
            op,
            count,
            std::ptr::null(),
            std::ptr::null_mut(),
        ))?;
        let p = st
            .comm
            .shared_all_reduce_init_raw(dt, count, op, in_place != 0)?;
        let (s, r) = (p.send_ptr(), p.recv_ptr());
        let id = new_handle();
        requests().lock().unwrap_or_else(|p| p.into_inner()).insert(
            id,
            Arc::new(Request {
                kind: RequestKind::Shared(p),
                comm: st.clone(),
            }),
        );
        // SAFETY: checked non-null above.
        unsafe {
            *sendbuff = s.cast();
            *recvbuff = r.cast();
            *request = id as gwRequest_t;
        }
        Ok(())
    })
}

/// Begins one round of a persistent request (`gwAllReduceInit`) and returns
/// at once: `sendbuff` is read from now on, and `recvbuff` holds the result
/// once `gwTest` reports the round done or `gwWait` returns. A round still
/// running is `gwInvalidUsage` (it keeps running); so is a request of an
/// `...Async` call, and a freed or unknown one (requests are numbered, never
/// reused, and looked up in a table, so a freed request is recognised
/// without touching freed memory). Thread-safe.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwStart(request: gwRequest_t) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let r = lookup_request(request)?;
        let res = match &r.kind {
            RequestKind::Once(_) => Err(Error::InvalidUsage(format!(
                "request {request:p} is not persistent: it was made by an ...Async call \
                 (only gwAllReduceInit's and gwAllReduceInitShared's requests can be started)"
            ))),
            // SAFETY: the caller promised the buffers at gwAllReduceInit,
            // until gwRequestFree.
            RequestKind::Persistent(p) => unsafe { p.start(&r.comm.comm) },
            // SAFETY: the caller keeps off the request's buffers while a
            // round runs (gwAllReduceInitShared's contract).
            RequestKind::Shared(p) => unsafe { p.start(&r.comm.comm) },
            RequestKind::Device(d) => return d.start(&*r.comm, None),
        };
        finish(
            &r,
            res.map_err(|e| match e {
                Error::InvalidUsage(m) => Error::InvalidUsage(format!("gwStart: {m}")),
                e => e,
            }),
        )
    })
}

/// `gwStart` ordered on CUDA stream `stream` (NULL: the default stream):
/// the round reads `sendbuff` after the work queued before it on `stream`,
/// and work queued after it sees `recvbuff`; it returns once the round is
/// queued. Where every rank's buffers are on one GPU the round is queued
/// entirely on the device (flags in device memory, no host message), and
/// rounds of one request should stay on one stream (a round on another
/// stream first waits for the previous one). Otherwise, and for host
/// memory, the round runs before this returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwStartStream(
    request: gwRequest_t,
    stream: *mut std::ffi::c_void,
) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let r = lookup_request(request)?;
        match &r.kind {
            RequestKind::Device(d) => d.start(&*r.comm, Some(stream)),
            RequestKind::Persistent(p) => {
                cuda::sync_stream_if_loaded(stream)?;
                // SAFETY: as gwStart.
                let res = unsafe { p.start(&r.comm.comm) }.and_then(|_| p.wait(&r.comm.comm));
                finish(&r, res)
            }
            RequestKind::Shared(p) => {
                cuda::sync_stream_if_loaded(stream)?;
                // SAFETY: as gwStart.
                let res = unsafe { p.start(&r.comm.comm) }.and_then(|_| p.wait(&r.comm.comm));
                finish(&r, res)
            }
            RequestKind::Once(_) => fail(
                gwInvalidUsage,
                format!("gwStartStream: request {request:p} is not persistent"),
            ),
        }
    })
}

/// Frees a persistent request (`gwAllReduceInit`): if a round is running,
/// waits for it first (as `gwWait` without a limit), then deregisters the
/// buffers and forgets the plan. The request is freed in every case, and
/// later calls with it return `gwInvalidUsage`; the result is the running
/// round's error if it failed, else `gwSuccess`. The buffers may be freed
/// once it returns. On the request of an `...Async` call it likewise waits
/// for the operation and frees the request. Thread-safe, but no other call
/// may use the request meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gwRequestFree(request: gwRequest_t) -> gwResult_t {
    guard(std::ptr::null_mut(), || {
        let r = lookup_request(request)?;
        // Out of the table first: a later call with it is gwInvalidUsage.
        free_request(request);
        let res = match &r.kind {
            RequestKind::Once(h) => h.wait(),
            RequestKind::Persistent(p) => p.free(&r.comm.comm),
            RequestKind::Shared(p) => p.free(&r.comm.comm),
            RequestKind::Device(d) => {
                d.wait(None)?;
                Ok(())
            }
        };
        finish(&r, res)
    })
}

/// A static description of a result code (never NULL). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn gwGetErrorString(result: ResultArg) -> *const c_char {
    let s: &'static CStr = match result.0 {
        0 => c"success",
        1 => c"invalid argument",
        2 => c"invalid usage",
        3 => c"system error",
        4 => c"remote error (another rank failed or disagrees)",
        5 => c"timeout",
        6 => c"aborted",
        7 => c"internal error",
        8 => c"preempted (checkpoint and exit 0)",
        _ => c"unknown gwResult_t value",
    };
    s.as_ptr()
}

/// The message of the last failure on `comm` (naming the cause: peer rank,
/// operation, address), or "no error". With `comm` NULL (or a destroyed one):
/// the last failure of any call on the calling thread, e.g. of an init. The
/// string stays valid until `comm` is destroyed (for NULL: until 64 newer
/// distinct failures on this thread, and while the thread lives). Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn gwGetLastError(comm: gwComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let st = if comm.is_null() {
            None
        } else {
            comms()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(comm as usize))
                .cloned()
        };
        if let Some(st) = st {
            let v = st.errors.lock().unwrap_or_else(|p| p.into_inner());
            // The CString's heap buffer does not move while it stays in `v`,
            // and `v` only grows until the communicator is destroyed.
            return v.last().map(|c| c.as_ptr()).unwrap_or(NO_ERROR.as_ptr());
        }
        LAST.with(|l| {
            l.borrow()
                .last()
                .map(|c| c.as_ptr())
                .unwrap_or(NO_ERROR.as_ptr())
        })
    }));
    r.unwrap_or(c"internal error: panic in gwGetLastError".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(comm: gwComm_t) -> String {
        // SAFETY: gwGetLastError returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(gwGetLastError(comm)) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn panics_become_internal_errors_with_a_message() {
        let r = guard(std::ptr::null_mut(), || panic!("boom in a test"));
        assert_eq!(r, gwInternalError);
        assert!(last(std::ptr::null_mut()).contains("boom in a test"));
    }

    #[test]
    fn error_codes_follow_the_documented_mapping() {
        assert_eq!(
            code_of(&Error::InvalidArgument("x".into())),
            gwInvalidArgument
        );
        assert_eq!(code_of(&Error::InvalidUsage("x".into())), gwInvalidUsage);
        assert_eq!(code_of(&Error::last_os("read", "test")), gwSystemError);
        let remote = Error::Remote {
            rank: 3,
            addr: "a:1".into(),
            what: "died".into(),
        };
        assert_eq!(code_of(&remote), gwRemoteError);
        let mismatch = Error::Mismatch {
            me: 0,
            peer: 1,
            local: "a".into(),
            remote: "b".into(),
        };
        assert_eq!(code_of(&mismatch), gwRemoteError);
        let t = Error::Timeout {
            secs: 1.0,
            what: "x".into(),
        };
        assert_eq!(code_of(&t), gwTimeout);
        assert_eq!(code_of(&Error::Aborted("x".into())), gwAborted);
        assert_eq!(code_of(&Error::Config("x".into())), gwInternalError);
        assert_eq!(code_of(&Error::Internal("x".into())), gwInternalError);
    }

    #[test]
    fn enums_are_validated_as_integers() {
        assert!(dtype(DataTypeArg(5)).is_ok());
        assert!(dtype(DataTypeArg(7)).is_err());
        assert!(dtype(DataTypeArg(255)).is_err());
        assert!(dtype(DataTypeArg(-1)).is_err());
        assert!(redop(RedOpArg(4)).is_ok());
        assert!(redop(RedOpArg(5)).is_err());
        assert!(redop(RedOpArg(255)).is_err());
    }

    #[test]
    fn unique_ids_round_trip_and_garbage_is_rejected() {
        let mut id = gwUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { gwGetUniqueId(&mut id) }, gwSuccess);
        let d = decode_id(&id).ok().expect("decodes");
        assert!(d.store.contains(':') && d.token.len() == 32 && d.job_id.starts_with("capi-"));
        let junk = gwUniqueId {
            internal: [b'x' as c_char; 128],
        };
        assert!(decode_id(&junk).is_err());
        let mut comm: gwComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { gwCommInitRank(&mut comm, 2, junk, 0) };
        assert_eq!(r, gwInvalidArgument);
        assert!(comm.is_null());
        // SAFETY: as above.
        assert_eq!(
            unsafe { gwCommInitRank(&mut comm, 0, id, 0) },
            gwInvalidArgument
        );
    }

    #[test]
    fn config_needs_the_magic_and_valid_transport() {
        let mut c = gwConfig_t {
            size: std::mem::size_of::<gwConfig_t>(),
            magic: GW_CONFIG_MAGIC,
            version: GW_CONFIG_VERSION,
            timeout_ms: 1500,
            transport: 1,
        };
        let cfg = config_from(&c).ok().expect("valid config");
        assert_eq!(cfg.timeout.value, Duration::from_millis(1500));
        assert_eq!(cfg.transport.value, TransportChoice::Tcp);
        c.transport = 9;
        assert!(config_from(&c).is_err());
        c.transport = -1;
        c.magic = 1;
        assert!(config_from(&c).is_err());
        // An older, shorter struct keeps the defaults of the missing fields.
        c.magic = GW_CONFIG_MAGIC;
        c.size = std::mem::offset_of!(gwConfig_t, timeout_ms);
        let cfg = config_from(&c).ok().expect("short config");
        assert_eq!(cfg.timeout.value, Config::default().timeout.value);
    }

    #[test]
    fn single_rank_communicator_through_a_unique_id() {
        let mut id = gwUniqueId { internal: [0; 128] };
        let mut comm: gwComm_t = std::ptr::null_mut();
        // SAFETY: valid pointers and buffers throughout.
        unsafe {
            assert_eq!(gwGetUniqueId(&mut id), gwSuccess);
            assert_eq!(
                gwCommInitRank(&mut comm, 1, id, 0),
                gwSuccess,
                "{}",
                last(std::ptr::null_mut())
            );
            let mut buf = [1.0f32, 2.0, 3.0];
            let p = buf.as_mut_ptr().cast();
            assert_eq!(
                gwAllReduce(p, p, 3, DataTypeArg(5), RedOpArg(0), comm),
                gwSuccess
            );
            assert_eq!(buf, [1.0, 2.0, 3.0]);
            let mut req: gwRequest_t = std::ptr::null_mut();
            assert_eq!(gwBarrierAsync(comm, &mut req), gwSuccess);
            assert_eq!(gwWait(req, 5000), gwSuccess);
            assert_eq!(gwWait(req, 0), gwInvalidUsage);
            assert_eq!(gwCommDestroy(comm), gwSuccess);
            assert_eq!(gwBarrier(comm), gwInvalidUsage);
            assert!(last(comm).contains("destroyed"));
        }
    }

    #[test]
    fn two_ranks_in_one_process_meet_through_a_unique_id() {
        let mut id = gwUniqueId { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { gwGetUniqueId(&mut id) }, gwSuccess);
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    let mut comm: gwComm_t = std::ptr::null_mut();
                    let mut buf = [r as f64 + 1.0; 5];
                    let p = buf.as_mut_ptr().cast();
                    // SAFETY: valid pointers and buffers throughout.
                    unsafe {
                        assert_eq!(
                            gwCommInitRank(&mut comm, 2, id, r),
                            gwSuccess,
                            "{}",
                            last(std::ptr::null_mut())
                        );
                        assert_eq!(
                            gwAllReduce(p, p, 5, DataTypeArg(6), RedOpArg(0), comm),
                            gwSuccess,
                            "{}",
                            last(comm)
                        );
                        assert_eq!(gwCommDestroy(comm), gwSuccess);
                    }
                    buf
                })
            })
            .collect();
        for t in ranks {
            assert_eq!(t.join().expect("rank thread"), [3.0; 5]);
        }
    }
}
