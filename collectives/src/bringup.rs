//! Bringing a communicator up, one step per function.
//!
//! 1. [`listen`]: open the TCP data-plane listener (its address is published).
//! 2. [`rendezvous`]: through the store, claim this rank, publish its record
//!    (and, on rank 0, the cost model), and wait with the init deadline for
//!    every other rank's; ranks that never arrive are named, with what each
//!    was bringing up instead.
//! 3. [`route`]: decide which transport reaches which rank (shared memory to
//!    same-host peers, TCP to the rest, or what `GW_TRANSPORT` forces) and
//!    where the ranks sit on hosts.
//! 4. [`start_engine`]: the progress engine, its mailbox and its thread.
//!
//! Connections are made later and lazily, by the engine, only to the peers
//! an algorithm talks to.

use crate::algo;
use crate::board::Board;
use crate::comm_key::CommKey;
use crate::config::{Config, Source, TransportChoice};
use crate::drive::{Driver, engine_thread};
use crate::engine::{Engine, EngineConfig};
use crate::mailbox;
use crate::model::{CostModel, LinkKind, Shape};
use gw_rendezvous::launch_env::fnv1a;
use gw_rendezvous::{LaunchEnv, PeerInfo, StoreClient, StoreConfig, StoreServer, peers};
use gw_transport::nic::NicConfig;
use gw_transport::ofi::{OfiConfig, OfiTransport};
use gw_transport::shm::{ShmConfig, ShmTransport};
use gw_transport::tcp::{TcpConfig, TcpTransport};
use gw_transport::{Error, Rank, Result, Transport};
use std::fmt::Write as _;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Operations the engine's queue holds before it grows: the mailbox's
/// room, and the engine's own queue of what it took out of it.
pub(crate) const QUEUE_CAPACITY: usize = 64;

/// The transports opened before rendezvous: their addresses go into this
/// rank's record.
pub(crate) struct Opened {
    pub tcp: Option<TcpTransport>,
    pub rdma: Option<Rdma>,
}

/// The one-sided NIC transport `GW_TRANSPORT` asked for, opened before
/// rendezvous: its endpoint name goes into the record.
pub(crate) enum Rdma {
    Ofi(OfiTransport),
    #[cfg(feature = "verbs")]
    Verbs(gw_transport::verbs::VerbsTransport),
}

impl Rdma {
    fn name_hex(&self) -> Result<String> {
        match self {
            Rdma::Ofi(t) => t.name_hex(),
            #[cfg(feature = "verbs")]
            Rdma::Verbs(t) => t.name_hex(),
        }
    }

    /// The route name, the GPUDirect line, and the transport with every
    /// peer's record (verbs: every queue pair connected).
    fn join(self, peers: &[PeerInfo]) -> Result<(&'static str, String, Box<dyn Transport>)> {
        match self {
            Rdma::Ofi(mut t) => {
                let line = t.gpudirect();
                t.set_peers(peers)?;
                Ok(("ofi", line, Box::new(t)))
            }
            #[cfg(feature = "verbs")]
            Rdma::Verbs(mut t) => {
                t.set_peers(peers)?;
                t.connect_all()?;
                let line = "off (gradwire's verbs backend stages device memory through pinned \
                            host memory)"
                    .to_string();
                Ok(("verbs", line, Box::new(t)))
            }
        }
    }
}

/// Step 1: the TCP transport, listening, unless only shared memory or
/// libfabric is used; the libfabric endpoint under `GW_TRANSPORT=ofi`.
pub(crate) fn listen(env: &LaunchEnv, cfg: &Config) -> Result<Opened> {
    let choice = cfg.transport.value;
    let rdma = if choice == TransportChoice::Verbs && env.world > 1 {
        Some(open_verbs(env, cfg)?)
    } else if choice == TransportChoice::Ofi && env.world > 1 {
        let t = OfiTransport::open(
            env.rank,
            env.world as usize,
            OfiConfig {
                provider: cfg.ofi_provider.value.clone(),
                nic: NicConfig {
                    eager_frames: cfg.eager_frames.value,
                    ..NicConfig::default()
                },
            },
        )?;
        tracing::info!("ofi: provider {}", t.provider());
        Some(Rdma::Ofi(t))
    } else {
        None
    };
    if matches!(
        choice,
        TransportChoice::Shm | TransportChoice::Ofi | TransportChoice::Verbs
    ) && env.world > 1
    {
        return Ok(Opened { tcp: None, rdma });
    }
    let store_ip = env
        .store
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip());
    let tcp = Some(TcpTransport::new(
        env.rank,
        TcpConfig {
            lanes: cfg.lanes.value,
            segment_bytes: cfg.segment_bytes_for(LinkKind::Tcp),
            ifname: cfg.socket_ifname.value.clone(),
            store_ip,
            job_key: fnv1a(&[&env.token, &env.job_id]),
            send_buffer_bytes: cfg.socket_send_buffer_bytes.value,
            recv_buffer_bytes: cfg.socket_recv_buffer_bytes.value,
            eager_frames: cfg.eager_frames.value,
            small_frames: cfg.eager_small.value,
        },
    )?);
    Ok(Opened { tcp, rdma })
}

/// What the ranks learnt about each other through the store.
pub(crate) struct Met {
    pub store: StoreClient,
    /// The store this rank hosts (rank 0 of a Slurm or torchrun launch).
    pub store_server: Option<StoreServer>,
    /// Prefix of this communicator's store keys.
    pub prefix: String,
    /// Every rank's record, indexed by rank.
    pub peers: Vec<PeerInfo>,
    /// Rank 0's cost model, which every rank chooses algorithms with.
    pub model: CostModel,
    /// What shared-memory names are derived from: drawn by rank 0, known
    /// only to the ranks (see `gw_transport::shm`'s `names.rs`).
    pub shm_secret: String,
}

/// Job-wide key under which each rank says which communicator it is
/// bringing up, so that a rank left waiting can say what the missing ones
/// are doing instead.
fn initing_key(rank: Rank) -> String {
    format!("gw/initing/{rank}")
}

/// Step 2: claim, publish, and wait for everyone.
pub(crate) fn rendezvous(
    env: &LaunchEnv,
    key: &CommKey,
    cfg: &Config,
    opened: &Opened,
    timeout: Duration,
    deadline: Instant,
) -> Result<Met> {
    let (me, world) = (env.rank, env.world);
    let store_server = if env.host_store && me == 0 {
        // Without a token the launch environment only lets a loopback
        // store through, and it is bound to loopback alone.
        let bind = env.store_bind()?;
        if env.token.is_empty() {
            tracing::warn!(
                "GW_TOKEN is not set: any process on this host can join the store on {bind}; \
                 set the same GW_TOKEN for every rank to keep other users out"
            );
        }
        Some(StoreServer::start(
            bind,
            &env.token,
            StoreConfig::default(),
        )?)
    } else {
        None
    };
    let mut store = StoreClient::connect(&env.store, &env.token, deadline)?;
    store.set(&initing_key(me), key.as_str().as_bytes())?;

    let prefix = format!("gw/{key}");
    let claims = store.add(&format!("{prefix}/claim/{me}"), 1)?;
    if claims > 1 {
        return Err(Error::Config(format!(
            "rank {me} was started twice: another process already claimed rank {me} of communicator {key} in this job (check GW_RANK and the launcher)"
        )));
    }
    let info = PeerInfo {
        rank: me,
        host_id: peers::host_id(),
        hostname: peers::hostname(),
        pid: std::process::id(),
        tcp: opened
            .tcp
            .as_ref()
            .map(|t| vec![t.listen_addr()])
            .unwrap_or_default(),
        tcp_eager: opened.tcp.as_ref().map(|t| t.eager()).unwrap_or_default(),
        ofi: match &opened.rdma {
            Some(t) => t.name_hex()?,
            None => String::new(),
        },
        cores: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
        cpus: gw_rendezvous::peers::own_cpus(),
        fan_out: Some(cfg.fan_out.value),
    };
    // Rank 0's cost model, published before its peer record, so it is
    // there once every record is: all ranks choose algorithms from it.
    if me == 0 {
        let (model, source) = CostModel::load()?;
        tracing::info!("cost model from {source}: {model}");
        store.set(&format!("{prefix}/model"), model.encode().as_bytes())?;
        // Through the store, which only holders of the job's token can read,
        // never from anything a local user could see or guess.
        let secret = gw_rendezvous::token::random_hex(16)
            .map_err(|e| Error::sys("read", "/dev/urandom for the shared-memory name secret", e))?;
        store.set(&format!("{prefix}/shm-secret"), secret.as_bytes())?;
    }
    store.set(&format!("{prefix}/peer/{me}"), info.encode().as_bytes())?;
    let keys: Vec<String> = (0..world).map(|r| format!("{prefix}/peer/{r}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = match store.wait(&key_refs, deadline) {
        Ok(v) => v,
        Err(gw_rendezvous::Error::Timeout { .. }) => {
            let present = store.check(&key_refs)?;
            let mut missing = Vec::new();
            let mut elsewhere = Vec::new();
            for r in (0..world).filter(|&r| !present[r as usize]) {
                missing.push(r.to_string());
                if let Ok(Some(other)) = store.get(&initing_key(r)) {
                    let other = String::from_utf8_lossy(&other).into_owned();
                    if other != key.as_str() {
                        elsewhere.push(format!("rank {r} is bringing up communicator {other}"));
                    }
                }
            }
            let hint = if elsewhere.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} (create communicators of the same name in the same order on every rank, or from different threads)",
                    elsewhere.join(", ")
                )
            };
            return Err(Error::Timeout {
                secs: timeout.as_secs_f64(),
                what: format!(
                    "at init of communicator {key} on rank {me}: rank(s) {} of {world} never arrived at the store {}{hint}",
                    missing.join(", "),
                    env.store
                ),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let model = match store.get(&format!("{prefix}/model"))? {
        Some(v) => CostModel::decode(&String::from_utf8_lossy(&v))?,
        None => {
            return Err(Error::Protocol(
                "rank 0 published no cost model at init".into(),
            ));
        }
    };
    let shm_secret = match store.get(&format!("{prefix}/shm-secret"))? {
        Some(v) => String::from_utf8(v).map_err(|_| {
            Error::Protocol("rank 0's shared-memory name secret is not text".into())
        })?,
        None => {
            return Err(Error::Protocol(
                "rank 0 published no shared-memory name secret at init".into(),
            ));
        }
    };
    let mut peers = Vec::with_capacity(world as usize);
    for (r, v) in values.iter().enumerate() {
        let p = PeerInfo::decode(&String::from_utf8_lossy(v))?;
        if p.rank as usize != r {
            return Err(Error::Protocol(format!(
                "store record for rank {r} names rank {}",
                p.rank
            )));
        }
        peers.push(p);
    }
    Ok(Met {
        store,
        store_server,
        prefix,
        peers,
        model,
        shm_secret,
    })
}

/// Which transport reaches which rank, and where the ranks are.
pub(crate) struct Routes {
    pub transports: Vec<Box<dyn Transport>>,
    /// Index into `transports` per rank (unused for this rank).
    pub route: Vec<usize>,
    /// The transport's name per rank ("tcp", "shm", "self").
    pub names: Vec<&'static str>,
    pub hostnames: Vec<String>,
    /// Links and host grid, for the cost model.
    pub shape: Shape,
    /// How the ranks sit on hosts, for errors when hier cannot run.
    pub host_layout: String,
    /// Processors this host gives the job's ranks on it (see [`host_cpus`];
    /// this rank's own count where no rank could tell).
    pub host_cpus: usize,
    /// Every rank allows fan-out schedules (see [`agreed_fan_out`]).
    pub fan_out: bool,
}

/// Step 3: routes every peer to a transport; index 0 is TCP when present, then shm.
pub(crate) fn route(
    env: &LaunchEnv,
    key: &CommKey,
    cfg: &Config,
    opened: Opened,
    peers: &[PeerInfo],
    shm_secret: &str,
) -> Result<Routes> {
    let Opened { tcp, rdma } = opened;
    let me = env.rank;
    let choice = cfg.transport.value;
    let host_id = &peers[me as usize].host_id;
    let on_host: Vec<&PeerInfo> = peers.iter().filter(|p| &p.host_id == host_id).collect();
    // Unknown (no rank could count): this rank's own count stands in.
    let cpus = match host_cpus(&on_host) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    let mut transports: Vec<Box<dyn Transport>> = Vec::new();
    let tcp_idx = tcp.is_some().then_some(0usize);
    let needs_shm = peers.iter().any(|p| {
        p.rank != me
            && !matches!(
                choice,
                TransportChoice::Tcp | TransportChoice::Ofi | TransportChoice::Verbs
            )
            && &p.host_id == host_id
    });
    if let Some(mut t) = tcp {
        t.set_peers(peers.to_vec());
        transports.push(Box::new(t));
    }
    let shm_idx = if needs_shm {
        let pulls = cfg.shm_pulls_for(env.local_size as usize, cpus);
        transports.push(Box::new(ShmTransport::new(
            me,
            peers.to_vec(),
            ShmConfig {
                job_id: format!("{}-{key}", env.job_id),
                name_secret: shm_secret.to_owned(),
                slot_bytes: cfg.shm_slot_bytes.value,
                slots: cfg.shm_slots.value,
                pull_bytes: pulls.bytes,
                pull_region_max: pulls.region_max,
                p2p_pull_bytes: pulls.p2p_bytes,
                eager_frames: cfg.eager_frames.value,
                adaptive: cfg.shm_adapt_for(env.local_size as usize, cpus),
            },
        )?));
        Some(transports.len() - 1)
    } else {
        None
    };
    let mut rdma_gpudirect = None;
    let rdma_idx = match rdma {
        Some(r) => {
            let (name, line, t) = r.join(peers)?;
            rdma_gpudirect = Some((name, line));
            transports.push(t);
            Some(transports.len() - 1)
        }
        None => None,
    };
    let mut route = vec![0usize; env.world as usize];
    let mut names = vec!["self"; env.world as usize];
    for p in peers.iter().filter(|p| p.rank != me) {
        let same_host = &p.host_id == host_id;
        let (idx, name) = match (choice, same_host) {
            (TransportChoice::Shm, false) => {
                return Err(Error::Config(format!(
                    "GW_TRANSPORT=shm, but rank {} is on another host ({}); use auto or tcp",
                    p.rank, p.hostname
                )));
            }
            (TransportChoice::Ofi, _) => (rdma_idx, "ofi"),
            (TransportChoice::Verbs, _) => (rdma_idx, "verbs"),
            (TransportChoice::Tcp, _) | (TransportChoice::Auto, false) => (tcp_idx, "tcp"),
            (_, true) => (shm_idx, "shm"),
        };
        let idx =
            idx.ok_or_else(|| Error::Internal(format!("no {name} transport for rank {}", p.rank)))?;
        route[p.rank as usize] = idx;
        names[p.rank as usize] = name;
        tracing::info!(
            "rank {} ({}): {name}{}",
            p.rank,
            p.hostname,
            if same_host {
                " (same host)"
            } else {
                " (other host)"
            }
        );
    }

    tracing::info!("GPUDirect RDMA: {}", gpudirect_line(&names, rdma_gpudirect));

    let link = if names.iter().any(|n| matches!(*n, "tcp" | "ofi" | "verbs")) {
        LinkKind::Tcp
    } else {
        LinkKind::Shm
    };
    // Every rank sees the same records, so every rank finds the same
    // layout, and with rank 0's model makes the same choice.
    let host_ids: Vec<&str> = peers.iter().map(|p| p.host_id.as_str()).collect();
    let local = host_grid(&host_ids);
    let host_layout = describe_hosts(&host_ids);
    let shape = Shape {
        n: env.world as usize,
        link,
        intra: if choice == TransportChoice::Tcp {
            LinkKind::Tcp
        } else {
            LinkKind::Shm
        },
        local: local.map(|l| l as usize),
        oversubscription: oversubscription(peers),
    };
    tracing::info!(
        "hosts: {host_layout}{}",
        match shape.grid() {
            Some((h, l)) => format!(" ({h} × {l}: hier available)"),
            None => " (not grouped host by host in equal numbers: no hier)".into(),
        }
    );
    Ok(Routes {
        transports,
        route,
        names,
        hostnames: peers.iter().map(|p| p.hostname.clone()).collect(),
        shape,
        host_layout,
        host_cpus: cpus,
        fan_out: agreed_fan_out(peers)?,
    })
}

/// Whether large all-gathers and broadcasts may fan out: every rank must
/// run the same schedule, so `GW_FANOUT` must be alike on all of them. A
/// peer from a build before the setting says nothing and never fans out,
/// so then no rank does.
fn agreed_fan_out(peers: &[PeerInfo]) -> Result<bool> {
    let said = |v: bool| -> Vec<u32> {
        peers
            .iter()
            .filter(|p| p.fan_out == Some(v))
            .map(|p| p.rank)
            .collect()
    };
    let (on, off) = (said(true), said(false));
    if !on.is_empty() && !off.is_empty() {
        return Err(Error::Config(format!(
            "GW_FANOUT differs between ranks: 1 on ranks {}, 0 on ranks {}; \
             set it alike on every rank",
            rank_list(&on),
            rank_list(&off)
        )));
    }
    Ok(on.len() == peers.len())
}

/// Ranks for an error message: all of them where few, else the first ones
/// and how many more.
fn rank_list(ranks: &[u32]) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<String> = ranks.iter().take(SHOWN).map(u32::to_string).collect();
    match ranks.len().checked_sub(SHOWN) {
        Some(more) if more > 0 => format!("{} and {more} more", shown.join(", ")),
        _ => shown.join(", "),
    }
}

/// The init line on GPUDirect RDMA: the RDMA transport's answer where it
/// carries data, else which transports do instead.
fn gpudirect_line(names: &[&str], rdma: Option<(&str, String)>) -> String {
    if let Some((_, line)) = rdma.filter(|(n, _)| names.contains(n)) {
        return line;
    }
    let mut used: Vec<&str> = names.iter().copied().filter(|n| *n != "self").collect();
    used.sort_unstable();
    used.dedup();
    if used.is_empty() {
        return "off (one rank: nothing moves between ranks)".into();
    }
    format!(
        "off (no RDMA transport in use: {}; device data is staged through pinned host \
         memory, or goes over CUDA IPC between ranks on one GPU)",
        used.join(", ")
    )
}

/// How many processors a host gives the job's ranks on it, `on_host` (0:
/// unknown): the union of their affinity masks, so that ranks a launcher
/// bound to a core each (`srun --cpu-bind=cores`, `taskset` per rank) do
/// not take their host for a one-core machine. A rank that counts fewer than
/// its mask holds is under a CPU quota (a container's cgroup), which caps
/// the host's count too. Where some rank did not say which processors (an
/// older peer), the fewest any rank could count. Every rank computes it
/// from the same records, so all agree.
fn host_cpus(on_host: &[&PeerInfo]) -> u32 {
    let on_host = || on_host.iter();
    if on_host().all(|p| !p.cpus.is_empty()) {
        let mut all: Vec<u32> = on_host().flat_map(|p| p.cpus.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        let quota = on_host()
            .filter(|p| p.cores > 0 && (p.cores as usize) < p.cpus.len())
            .map(|p| p.cores)
            .min();
        let union = all.len() as u32;
        return quota.map_or(union, |q| q.min(union));
    }
    on_host()
        .map(|p| p.cores)
        .filter(|&c| c > 0)
        .min()
        .unwrap_or(0)
}

/// How many ranks share the busiest processor of the most crowded host,
/// ⌈ranks / processors⌉ (at least 1): every rank computes it from the same
/// records.
fn oversubscription(peers: &[PeerInfo]) -> f64 {
    let mut hosts: std::collections::BTreeMap<&str, Vec<&PeerInfo>> = Default::default();
    for p in peers {
        hosts.entry(p.host_id.as_str()).or_default().push(p);
    }
    hosts
        .values()
        .map(|ranks| (ranks.len() as u32, host_cpus(ranks)))
        .filter(|&(_, cpus)| cpus > 0)
        .map(|(ranks, cpus)| f64::from(ranks.div_ceil(cpus)))
        .fold(1.0, f64::max)
}

/// The running engine and what callers need to use it.
pub(crate) struct Started {
    pub tx: mailbox::Sender,
    pub driver: Arc<Driver>,
    pub abort: Arc<AtomicBool>,
    pub thread: JoinHandle<()>,
    /// Messages in flight per stream (`OpSpec::depth`).
    pub depth: usize,
    /// How long a caller spins on a completion before sleeping.
    pub caller_spin: Duration,
    /// Every rank of this host has a core for its engine thread besides its
    /// caller's: then the engine thread progressing work in the background
    /// takes no core from anyone.
    pub engine_core: bool,
}

/// Step 4: the engine over `transports`, and its thread, started.
pub(crate) fn start_engine(
    env: &LaunchEnv,
    cfg: &Config,
    routes: &mut Routes,
    board: Board,
    span: tracing::Span,
) -> Result<Started> {
    let me = env.rank;
    let (tx, rx) = mailbox::channel(QUEUE_CAPACITY);
    let abort = Arc::new(AtomicBool::new(false));
    // The host's processors, not this rank's: a rank bound to one core is
    // not oversubscribed when its peers have cores of their own.
    let own = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ncpu = routes.host_cpus;
    let spin = Duration::from_micros(cfg.spin_us.value);
    let oversubscribed = env.local_size as usize > ncpu;
    let depth = cfg.pipeline_depth_for(env.local_size as usize, ncpu);
    if !(1..=algo::MAX_DEPTH).contains(&depth) {
        return Err(Error::Config(format!(
            "pipeline depth {depth} out of range 1..={} (GW_PIPELINE_DEPTH)",
            algo::MAX_DEPTH
        )));
    }
    tracing::info!(
        "pipeline depth {depth} ({} ranks on this host, {ncpu} cores)",
        env.local_size
    );
    // A caller spinning on its completion competes with its own engine
    // thread: only worth it when every rank's two threads have a core, and
    // this rank may run on two.
    let engine_core = 2 * env.local_size as usize <= ncpu && own >= 2;
    let caller_spin = if engine_core { spin } else { Duration::ZERO };
    let (engine, poll, waker) = Engine::new(
        EngineConfig {
            me,
            timeout: cfg.timeout.value,
            spin,
            oversubscribed,
            hostnames: routes.hostnames.clone(),
            board: Some(board),
        },
        std::mem::take(&mut routes.transports),
        std::mem::take(&mut routes.route),
        rx,
        abort.clone(),
    )?;
    let chosen = cfg.spin_us.source != Source::Default;
    let driver = Driver::new(
        engine,
        waker,
        cfg.inline.value,
        crate::drive::drive_spin(spin, chosen, oversubscribed),
        (!oversubscribed).then_some(crate::drive::HANDOVER_NAP),
        span.clone(),
    );
    // The engine thread reports once it has made its start-up allocations
    // (see `engine_thread`); a thread that died first drops the sender,
    // which ends the wait with an error instead of a hang.
    let (started, has_started) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name(format!("gw-engine-{me}"))
        .spawn({
            let driver = driver.clone();
            move || {
                let _in_comm = span.enter();
                engine_thread(driver, poll, started)
            }
        })
        .map_err(|e| Error::sys("pthread_create", "engine thread", e))?;
    has_started.recv().map_err(|_| {
        Error::Internal(format!(
            "rank {me}: the engine thread ended before it started"
        ))
    })?;
    Ok(Started {
        tx,
        driver,
        abort,
        thread,
        depth,
        caller_spin,
        engine_core,
    })
}

/// Ranks per host when `host_ids` (one per rank) come in equal runs of
/// consecutive ranks, one run per host: the layout hier needs.
fn host_grid(host_ids: &[&str]) -> Option<u32> {
    let first = *host_ids.first()?;
    let local = host_ids.iter().take_while(|h| **h == first).count();
    if !host_ids.len().is_multiple_of(local) {
        return None;
    }
    let runs: Vec<&[&str]> = host_ids.chunks(local).collect();
    let uniform = runs.iter().all(|run| run.iter().all(|h| *h == run[0]));
    let mut heads: Vec<&str> = runs.iter().map(|run| run[0]).collect();
    heads.sort_unstable();
    heads.dedup();
    // A host that appears in two runs is not host by host.
    if !uniform || heads.len() != runs.len() {
        return None;
    }
    u32::try_from(local).ok()
}

/// The host of each rank, numbered in order of first appearance: "ranks
/// 0-1 on host 0, 2-3 on host 1" reads as "hosts by rank: 0 0 1 1".
fn describe_hosts(host_ids: &[&str]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut s = String::from("hosts by rank:");
    for h in host_ids {
        let i = seen.iter().position(|x| x == h).unwrap_or_else(|| {
            seen.push(h);
            seen.len() - 1
        });
        let _ = write!(s, " {i}");
    }
    s
}

/// `GW_TRANSPORT=verbs`: the device and a queue pair per peer. Without an
/// RDMA device the error is the system's reason ("no RDMA device: ..."),
/// before any rendezvous.
#[cfg(feature = "verbs")]
fn open_verbs(env: &LaunchEnv, cfg: &Config) -> Result<Rdma> {
    let device = gw_verbs::Config::from_env()
        .map_err(|e| Error::Config(format!("GW_TRANSPORT=verbs: {e}")))?;
    let t = gw_transport::verbs::VerbsTransport::open(
        env.rank,
        env.world as usize,
        &device,
        NicConfig {
            eager_frames: cfg.eager_frames.value,
            ..NicConfig::default()
        },
    )?;
    Ok(Rdma::Verbs(t))
}

/// `GW_TRANSPORT=verbs` in a build without the verbs backend: what a
/// device check finds, and how to rebuild.
#[cfg(not(feature = "verbs"))]
fn open_verbs(_env: &LaunchEnv, _cfg: &Config) -> Result<Rdma> {
    let cfg = gw_verbs::Config::from_env()
        .map_err(|e| Error::Config(format!("GW_TRANSPORT=verbs: {e}")))?;
    Err(match gw_verbs::open(&cfg) {
        Err(e) => Error::Config(format!("GW_TRANSPORT=verbs: {e}")),
        Ok(hca) => Error::Config(format!(
            "GW_TRANSPORT=verbs: found {hca:?}, but this gradwire was built without its verbs \
             backend: rebuild with --features gw-collectives/verbs"
        )),
    })
}

/// Under `GW_TRANSPORT=verbs`, waits until every rank has its queue pairs
/// in RTS: a queue pair still in INIT drops what arrives, and a sender
/// gives up after its retries (about half a second).
pub(crate) fn all_connected(
    store: &mut StoreClient,
    prefix: &str,
    me: Rank,
    world: u32,
    deadline: Instant,
) -> Result<()> {
    store.set(&format!("{prefix}/verbs-up/{me}"), b"1")?;
    let keys: Vec<String> = (0..world)
        .map(|r| format!("{prefix}/verbs-up/{r}"))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    match store.wait(&keys, deadline) {
        Ok(_) => Ok(()),
        // Its message lists the ranks' keys still missing.
        Err(gw_rendezvous::Error::Timeout { secs, what }) => Err(Error::Timeout {
            secs,
            what: format!(
                "GW_TRANSPORT=verbs: waiting for every rank's queue pairs to connect: {what}"
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod layout_tests {
    use super::{agreed_fan_out, describe_hosts, host_cpus, host_grid, oversubscription};
    use gw_rendezvous::peers::PeerInfo;

    /// Rank `rank` on host "h", with the processors `cpus`.
    fn on_h(rank: u32, cpus: &[u32]) -> PeerInfo {
        PeerInfo {
            rank,
            host_id: "h".into(),
            hostname: "h".into(),
            pid: rank,
            tcp: Vec::new(),
            tcp_eager: Default::default(),
            ofi: String::new(),
            cores: cpus.len() as u32,
            cpus: cpus.to_vec(),
            fan_out: None,
        }
    }

    #[test]
    fn fan_out_only_where_every_rank_allows_it_and_a_split_is_refused() {
        let rank = |rank, fan_out| PeerInfo {
            fan_out,
            ..on_h(rank, &[0, 1])
        };
        let all = |v| (0..4).map(|r| rank(r, v)).collect::<Vec<_>>();
        assert!(agreed_fan_out(&all(Some(true))).unwrap());
        assert!(!agreed_fan_out(&all(Some(false))).unwrap());
        // A peer built before the setting never fans out, so no rank does.
        let mut old = all(Some(true));
        old[2].fan_out = None;
        assert!(!agreed_fan_out(&old).unwrap());
        let mut split = all(Some(true));
        split[1].fan_out = Some(false);
        split[3].fan_out = Some(false);
        let e = agreed_fan_out(&split).unwrap_err().to_string();
        assert!(
            e.contains("GW_FANOUT")
                && e.contains("1 on ranks 0, 2")
                && e.contains("0 on ranks 1, 3"),
            "{e}"
        );
        let many: Vec<_> = (0..20).map(|r| rank(r, Some(r != 0))).collect();
        let e = agreed_fan_out(&many).unwrap_err().to_string();
        assert!(
            e.contains("1 on ranks 1, 2, 3, 4, 5, 6, 7, 8 and 11 more"),
            "{e}"
        );
    }

    #[test]
    fn the_most_crowded_host_sets_the_oversubscription() {
        let rank = |rank, host: &str, cores| PeerInfo {
            rank,
            host_id: host.into(),
            hostname: host.into(),
            pid: rank,
            tcp: Vec::new(),
            tcp_eager: Default::default(),
            ofi: String::new(),
            cores,
            cpus: Vec::new(),
            fan_out: None,
        };
        // Host a: 3 ranks on 2 processors, so one processor runs two of
        // them; host b: 2 ranks on 8.
        let peers = [
            rank(0, "a", 2),
            rank(1, "a", 2),
            rank(2, "a", 2),
            rank(3, "b", 8),
            rank(4, "b", 8),
        ];
        assert_eq!(oversubscription(&peers), 2.0);
        // Room to spare, or counts unknown (older peers): 1.
        assert_eq!(oversubscription(&peers[3..]), 1.0);
        assert_eq!(oversubscription(&[rank(0, "c", 0), rank(1, "c", 0)]), 1.0);
        // One rank that could not count does not make its host one core.
        assert_eq!(
            oversubscription(&[rank(0, "d", 8), rank(1, "d", 0), rank(2, "d", 8)]),
            1.0
        );
    }

    /// [`host_cpus`] of the ranks of `peers` on `host`.
    fn cpus_of(peers: &[PeerInfo], host: &str) -> u32 {
        host_cpus(
            &peers
                .iter()
                .filter(|p| p.host_id == host)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn ranks_bound_to_cores_of_their_own_are_not_oversubscribed() {
        let rank = on_h;
        // Each rank bound to a core of its own: each sees one, the host
        // gives the job two.
        let bound = [rank(0, &[0]), rank(1, &[1])];
        assert_eq!(cpus_of(&bound, "h"), 2);
        assert_eq!(oversubscription(&bound), 1.0);
        // Both bound to the same core do share it.
        let same = [rank(0, &[3]), rank(1, &[3])];
        assert_eq!(cpus_of(&same, "h"), 1);
        assert_eq!(oversubscription(&same), 2.0);
        // Four ranks over two cores, overlapping masks: two per core.
        let four = [
            rank(0, &[0, 1]),
            rank(1, &[0, 1]),
            rank(2, &[1]),
            rank(3, &[0]),
        ];
        assert_eq!(cpus_of(&four, "h"), 2);
        assert_eq!(oversubscription(&four), 2.0);
        // One rank that did not list its processors: the counts decide.
        let mut old = bound.clone();
        old[1].cpus.clear();
        assert_eq!(cpus_of(&old, "h"), 1);
        // A quota of 3 processors over a mask of 8 caps the host at 3.
        let quota = [
            rank(0, &[0, 1, 2, 3, 4, 5, 6, 7]),
            rank(1, &[0, 1, 2, 3, 4, 5, 6, 7]),
        ]
        .map(|mut p| {
            p.cores = 3;
            p
        });
        assert_eq!(cpus_of(&quota, "h"), 3);
        // Another host's ranks do not count.
        assert_eq!(cpus_of(&bound, "other"), 0);
    }

    #[test]
    fn host_grid_needs_equal_consecutive_runs() {
        assert_eq!(host_grid(&["a", "a", "b", "b"]), Some(2));
        assert_eq!(host_grid(&["a", "a", "a", "b", "b", "b"]), Some(3));
        assert_eq!(host_grid(&["a", "b", "c", "d"]), Some(1));
        assert_eq!(host_grid(&["a", "a", "a", "a"]), Some(4));
        assert_eq!(host_grid(&["a"]), Some(1));
        assert_eq!(host_grid(&[]), None);
        // Uneven hosts, interleaved ranks, a host in two runs.
        assert_eq!(host_grid(&["a", "a", "b"]), None);
        assert_eq!(host_grid(&["a", "a", "b", "b", "b", "b"]), None);
        assert_eq!(host_grid(&["a", "b", "a", "b"]), None);
        assert_eq!(host_grid(&["a", "a", "b", "b", "a", "a"]), None);
    }

    #[test]
    fn hosts_are_described_by_rank() {
        assert_eq!(
            describe_hosts(&["x", "y", "x", "z"]),
            "hosts by rank: 0 1 0 2"
        );
    }
}
