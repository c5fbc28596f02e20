//! The typed configuration of one communicator.
//!
//! Every knob lives in [`Config`] with its default; a program may set fields
//! through the API, and `GW_*` environment variables override both (as
//! `NCCL_*` variables do, so an operator can change a job without rebuilding
//! it). Each value remembers where it came from, and `GW_DEBUG=info` prints the
//! effective configuration with those sources at init.

use crate::algo::{Algo, MAX_DEPTH};
use crate::model::LinkKind;
use crate::op::OpKind;
use gw_transport::{Error, Result, SendHint};
use std::fmt;
use std::time::Duration;

/// Default segment of collectives over TCP. Each segment over loopback costs
/// system calls, frames and schedule steps whatever its size; interleaved on
/// this 2-core VM, 1 MiB segments and frames against 128 KiB took 4 ranks
/// 64 MiB from 220-238 to 185-191 ms and 2 ranks 256 MiB from a median of
/// 359 to 323 ms, with 1 and 16 MiB within noise. The frames grow with the
/// segments (1 MiB segments in 128 KiB frames, or the reverse, gained
/// little). Shared memory keeps 128 KiB: a segment that fits one ring slot
/// is reduced where it arrived (`engine/in_place.rs`).
pub const TCP_SEGMENT_BYTES: usize = gw_transport::tcp::DEFAULT_SEGMENT_BYTES;

/// Default pipeline depth where every rank of a host has a core of its own.
/// A deeper pipeline keeps more segments (and their scratch slots) live at
/// once, and past one the transports' own buffers (socket buffers, shm ring
/// slots) already keep the link busy: what the extra depth adds is data that
/// falls out of cache before it is read. On this 2-core VM, interleaved
/// against depth 8, 2 ranks: TCP 16 MiB 11.7 -> 8.9 ms, 64 MiB 56 -> 36 ms,
/// 256 MiB 208 -> 133 ms; shm 16 MiB 5.8 -> 4.3 ms, 256 MiB 89 -> 75 ms.
/// This rests on sends that complete locally, as both transports' do; one
/// whose sends complete only on the peer's acknowledgement (RDMA) would want
/// a deeper window to cover the round trip.
pub const DEPTH_CORE_PER_RANK: usize = 1;

/// Default pipeline depth where a host runs more ranks than it has cores: a
/// rank that gets a core then finds more posted work to do before it is
/// descheduled (4 shm ranks on 2 cores at 1 MiB: 0.58 ms at depth 8 against
/// 0.90 at depth 1).
pub const DEPTH_SHARED_CORES: usize = 8;

/// Where every rank of a host has a core of its own, shared-memory messages
/// from this size on are pulled by the receiver in one copy, out of regions
/// under [`PULL_REGION_MAX_CORE_PER_RANK`]. Two copies (into a ring slot,
/// out of it) run on two cores at once, but each is a full pass over the
/// message and the receiver waits for the first: on the 2026-12-05 VM,
/// 2 ranks, against slots only, a 64 KiB ping-pong took 3.8 µs instead of
/// 8.3 (OpenMPI's vader, one copy: 3.5–3.8), a 1 MiB one 50 instead of
/// 110, and collectives from 256 KiB to 1 MiB ran 1.2–2.0× faster
/// (all-reduce 1.21–1.27, all-gather 1.64–2.03, broadcast 1.24–1.26);
/// 64 KiB collectives take the direct path and do not change. Where ranks
/// share cores the copies cannot overlap anyway, and the transport's own
/// threshold ([`gw_transport::shm::DEFAULT_PULL_BYTES`]) applies to every
/// region. An earlier VM measured the opposite at 1 MiB (slot copies 5.2
/// GB/s, pulls 2.4), which is why pulls were off with a core per rank
/// until then; `GW_SHM_PULL_BYTES=0` turns them off.
pub const PULL_BYTES_CORE_PER_RANK: usize = 64 << 10;

/// Where every rank of a host has a core of its own, point-to-point
/// messages (a user's send, receive and sendrecv) from this size on are
/// pulled, out of any region. Their receiver only stores them, so the one
/// copy is the whole transfer; a collective's 16-32 KiB segments are read
/// out of their slots by a receiver that reduces them, and pulling those
/// lost. On the 2026-12-05 VM, 2 ranks, 16 KiB against 64 KiB as the
/// threshold for everything (`ab-builds.py`, 3 rounds): p2p 16 and 32 KiB
/// latency 1.56 and 1.81x as fast, one way 1.59 and 1.63x, both ways 1.21
/// and 1.29x, 4-8 KiB and 64-256 KiB unchanged (0.95-1.02); all-reduce 32
/// and 64 KiB 0.78 and 0.71x as fast.
pub const P2P_PULL_BYTES_CORE_PER_RANK: usize = 16 << 10;

/// Where ranks share cores, but at most [`STORED_PULLS_RANKS_PER_CORE`] to
/// a core, the segments of a broadcast or an all-gather with at least
/// [`STORED_PULLED_OUTPUT_SHARED_CORES`] of output (hinted
/// `SendHint::Stored` by the engine: their receivers store them, and a
/// broadcast's inner ranks forward them from where they landed) are pulled
/// in one copy from this size on, where other collectives' segments keep
/// the transport's threshold ([`gw_transport::shm::DEFAULT_PULL_BYTES`],
/// 256 KiB, above their 128 KiB segments). The engine marks those sends
/// wherever ranks share cores, but a fan-out broadcast's
/// ([`hint_where_cores_shared`]); with more than two ranks to a core this
/// threshold is the transport's, so the mark changes nothing there.
pub const STORED_PULL_BYTES_SHARED_CORES: usize = 64 << 10;

/// The least output of a broadcast or an all-gather whose segments are
/// pulled where ranks share cores (see [`STORED_PULL_BYTES_SHARED_CORES`]).
/// Through the slots each segment costs two copies, the sender's and the
/// receiver's, on cores with no time to spare; pulled it costs one, but
/// the send completes only once its receiver has run, which with cores
/// shared is a wait. Beyond the caches the copy saved weighs more; in
/// them, the wait. 2026-12-06 VM (2 cores), shm, `ab-builds.py`, slots
/// against segments pulled from 64 KiB at any size, 5 rounds, old/new at
/// 64 KiB / 256 KiB / 1 / 4 / 16 MiB: 4 ranks all-gather 0.90 / 0.83 / 1.03
/// / 1.12 / 1.17, broadcast 0.86 / 0.84 / 0.81 / 1.30 / 1.39; 3 ranks
/// all-gather 1.01 / 1.28 / 1.15 / 1.20 / 1.14, broadcast 1.03 / 1.18 / 0.88
/// / 1.41 / 1.40 (4-rank rounds spread 0.5-1.7 below 4 MiB; its 64 KiB
/// all-gather, whose 16 KiB blocks were not pulled, read 0.90 all the
/// same). At 8 ranks (4 to a core) 16 MiB was slower pulled (all-gather
/// 0.89, broadcast 0.96), hence [`STORED_PULLS_RANKS_PER_CORE`]; and the
/// 4-rank all-reduce, whose receivers reduce, 0.90 at 256 KiB and 16 MiB.
pub const STORED_PULLED_OUTPUT_SHARED_CORES: usize = 4 << 20;

/// The most ranks to a core for which [`STORED_PULL_BYTES_SHARED_CORES`]
/// applies: the more ranks wait for each core, the longer a pulled send
/// waits for its receiver to run.
pub const STORED_PULLS_RANKS_PER_CORE: usize = 2;

/// Which shared-memory messages are pulled in one copy (see
/// [`Config::shm_pulls_for`]), as [`gw_transport::shm::ShmConfig`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmPulls {
    /// Messages of at least this many bytes (`pull_bytes`; 0: none)...
    pub bytes: usize,
    /// ...out of registered regions under this size (`pull_region_max`).
    pub region_max: usize,
    /// Messages hinted `Stored` or `Exchanged` of at least this many bytes,
    /// out of any region (`p2p_pull_bytes`; 0: none): with a core per rank,
    /// point-to-point messages and a direct call's; where ranks share cores,
    /// a large broadcast's and all-gather's segments (point-to-point
    /// messages get no hint there).
    pub p2p_bytes: usize,
}

/// Messages out of registered regions of at least this size keep the slots
/// where every rank has a core (see [`PULL_BYTES_CORE_PER_RANK`]): they are
/// segments of a large operation, whose receiver streams them out of the
/// slots, and pulling them lost (same run, pulls against slots: all-reduce
/// 16 / 64 MiB 0.90 / 0.70, broadcast 4 / 16 / 64 MiB 0.92 / 0.91 / 0.60,
/// all-gather 64 MiB 0.89).
pub const PULL_REGION_MAX_CORE_PER_RANK: usize = 4 << 20;

/// A 2-rank all-gather whose output is at least [`PULL_REGION_MAX_CORE_PER_RANK`]
/// and under this size has its exchanges pulled all the same (hinted
/// `SendHint::Exchanged`): each rank only stores the other's block, and
/// one copy beats two up to where the output outgrows the caches and the
/// slots' streaming copy wins. 2026-12-05 VM (late), shm, `ab-builds.py` (4
/// rounds), slots against pulls, old/new: 4 MiB 1.04, 8 MiB 1.17, 16 MiB
/// 1.18 and 1.28 (two runs), 32 MiB 1.03 [0.94-1.12], 64 MiB 0.79
/// [0.75-0.86]; 1 MiB (pulled by the region rule already) 0.98 with the
/// hint, so smaller outputs keep that rule.
pub const ALL_GATHER_PULLED_BELOW: usize = 32 << 20;

/// Whether a 2-rank all-gather with `out_bytes` of output has its
/// exchanges pulled (see [`ALL_GATHER_PULLED_BELOW`]).
pub fn all_gather_pulled(ranks: usize, out_bytes: usize) -> bool {
    ranks == 2 && (PULL_REGION_MAX_CORE_PER_RANK..ALL_GATHER_PULLED_BELOW).contains(&out_bytes)
}

/// Whether an all-gather sends each rank's block as one message rather than
/// in segments: where its blocks are pulled and nothing forwards or adds
/// them. The receiver reads a pulled block in one copy, and the whole block
/// is in its owner's input from the start, so segments pipeline nothing,
/// while each costs a rendezvous, a pin of the owner's pages and a
/// completion. Two cases, both decided from what every rank shares:
/// - a fan-out all-gather (`fan_out`, see [`fans_out`]): every block goes
///   straight from its owner to every rank. 2026-12-06 VM (fourth session),
///   `ab-builds.py` segmented/whole, 6 rounds: 4 ranks 1.48, 1.43, 1.33,
///   1.23 and 1.20 at 4, 8, 16, 32 and 64 MiB of output (every round at
///   least 1.13), and in two more runs 4 MiB 1.09 and 1.20, 16 MiB 0.95 and
///   1.08, 64 MiB 1.17 and 1.08; 3 ranks 1.15, 1.22, 1.12 and 1.19 from 8
///   MiB. (A fan-out
///   broadcast's star, sent whole the same way, read 0.90, 0.97 and 1.06
///   at 4, 16 and 64 MiB, and keeps its segments.)
/// - a 2-rank all-gather over shared memory with a core per rank whose
///   blocks are pulled by the hint ([`all_gather_pulled`]). Same VM and
///   tool, 10 rounds: 4 MiB 1.26 [1.07-1.66], 8 MiB 1.13, 16 MiB 1.12.
///   Where the slots carry them instead (`GW_SHM_PULL_BYTES` set high, or
///   the kernel refusing cross-memory attach) a block is one message
///   streamed through the slots; one run of 3 rounds, with
///   `GW_SEGMENT_BYTES` as the proxy, read 0.94 and 1.04 at 4 and 16 MiB,
///   no difference seen. Smaller outputs, pulled by the region rule, keep
///   their segments (256 KiB 0.90, 1 MiB 1.06 whole), and so do outputs of
///   [`ALL_GATHER_PULLED_BELOW`] and more, which go through the slots (64
///   MiB 0.82 with 16 MiB segments, half a block).
pub fn all_gather_whole_blocks(
    ranks: usize,
    link: LinkKind,
    ranks_per_core: f64,
    out_bytes: usize,
    fan_out: bool,
) -> bool {
    fan_out
        || (link == LinkKind::Shm && ranks_per_core <= 1.0 && all_gather_pulled(ranks, out_bytes))
}

/// How, where ranks share cores, the engine hints an operation's sends: a
/// broadcast's or an all-gather's with at least
/// [`STORED_PULLED_OUTPUT_SHARED_CORES`] of output, and a fan-out
/// all-gather's whatever its size ([`fans_out`]), `SendHint::Stored`, for
/// the transport to pull from a threshold of its own, but a fan-out
/// broadcast's (`fan_out`) `SendHint::Pushed`, never pulled, whatever
/// `GW_SEGMENT_BYTES` makes of its segments. In that star every receiver
/// pulls the same segment out of the root at once, each pinning the same
/// pages of the root's buffer, where a chain's receivers each pull from a
/// different rank and the fan-out all-gather's receivers start each with a
/// different owner (that this is why the star alone lost is a hypothesis;
/// the figures below measure only the outcome).
/// 2026-12-06 VM (fourth session), `ab-builds.py`, pulled/slots at 4, 16
/// and 64 MiB: with `GW_SHM_PULL_BYTES` set high as the proxy, 4 ranks
/// 1.19, 1.55, 1.41 (6 rounds) and 3 ranks 1.44, 1.34, 1.36 (5 rounds); the
/// star through the slots against the chain pulled 1.34, 1.73, 1.47, and
/// against the chain through the slots 1.01, 1.25, 1.23 (4 ranks, 5
/// rounds); the build with this rule against the one before, 4 ranks 1.42,
/// 1.43, 1.47 (6 rounds, every round at least 1.11) and 3 ranks 1.68, 1.12,
/// 1.54 (5 rounds).
pub fn hint_where_cores_shared(op: OpKind, out_bytes: usize, fan_out: bool) -> Option<SendHint> {
    let large = out_bytes >= STORED_PULLED_OUTPUT_SHARED_CORES;
    match op {
        OpKind::Broadcast if fan_out => Some(SendHint::Pushed),
        OpKind::AllGather if fan_out => Some(SendHint::Stored),
        OpKind::Broadcast | OpKind::AllGather if large => Some(SendHint::Stored),
        _ => None,
    }
}

/// The most ranks a fan-out all-gather or broadcast runs on (see
/// [`fans_out`]).
pub const FAN_OUT_MAX_RANKS: usize = 8;

/// Whether an all-gather or a broadcast over shared memory with
/// `out_bytes` of output fans out (`algo/fan_gather.rs`, the star of
/// `algo/coll.rs`; `GW_FANOUT`), where the busiest core runs
/// `ranks_per_core` ranks: where ranks share cores (at most
/// [`FAN_OUT_RANKS_PER_CORE_MAX`] a core, from
/// [`STORED_PULLED_OUTPUT_SHARED_CORES`] of output, an all-gather with more
/// than two a core from less: [`FAN_OUT_GATHER_CORE_BYTES`]), where its
/// all-gather blocks are pulled. A pulled message is read out of its owner whether the
/// owner runs or not, so the fan-out's receives wait on no chain of ranks,
/// where each of the ring's steps waits for the next rank to be scheduled
/// (the star broadcast's segments go through the slots:
/// [`hint_where_cores_shared`]). 4 ranks on 2 cores, fan-out against ring,
/// `ab-builds.py` with one build, two runs: 4 MiB 1.60 [1.18-1.72] and 1.77
/// [1.08-3.67], 16 MiB 1.35 [1.09-1.42] and 1.13 [1.06-1.76]. Below that
/// size, and at 8 ranks (4 a core) while its 128 KiB segments went through
/// the slots, it measured within the spread either way (0.71-2.21), so the
/// ring stays below 4 MiB with two a core; at 4 a core with whole blocks
/// see [`FAN_OUT_RANKS_PER_CORE_MAX`] and [`FAN_OUT_GATHER_CORE_BYTES`]. A broadcast whose
/// root sends to every rank itself, against the chain, 4 ranks: 4 MiB 1.25
/// [0.92-1.37] and 1.07 [0.75-1.31], 16 MiB 1.07 [0.93-1.31] and 1.13
/// [0.87-1.45], 64 MiB 1.06 [0.98-1.08].
/// At most [`FAN_OUT_MAX_RANKS`] ranks: each keeps up to two pipelines of
/// messages in flight to every other, which the engine's and the
/// transports' reserved room holds at that size. Since its blocks go whole
/// ([`all_gather_whole_blocks`]), also where up to
/// [`FAN_OUT_RANKS_PER_CORE_MAX`] ranks share a core: there a block hinted
/// stored ([`hint_where_cores_shared`]) of 256 KiB or more is pulled too
/// (`GW_SHM_PULL_BYTES`'s default with more than two ranks a core), and a
/// fan-out all-gather's blocks are at least 512 KiB (4 MiB over at most 8
/// ranks), or 256 KiB (2 MiB over 8 ranks) with four a core.
/// Where more than [`STORED_PULLS_RANKS_PER_CORE`] ranks share a core, an
/// all-gather fans out from a smaller output: see
/// [`FAN_OUT_GATHER_CORE_BYTES`]. `all_gather` says which operation
/// asks; every other argument is what every rank shares.
pub fn fans_out(ranks: usize, ranks_per_core: f64, out_bytes: usize, all_gather: bool) -> bool {
    // Two a core gives the all-gather the broadcast's 4 MiB.
    let least = if all_gather {
        fan_out_gather_least(ranks_per_core)
    } else {
        STORED_PULLED_OUTPUT_SHARED_CORES
    };
    (3..=FAN_OUT_MAX_RANKS).contains(&ranks)
        && ranks_per_core > 1.0
        && ranks_per_core <= FAN_OUT_RANKS_PER_CORE_MAX as f64
        && out_bytes >= least
}

/// Where more than [`STORED_PULLS_RANKS_PER_CORE`] ranks share a core, an
/// all-gather fans out once the output times the ranks on the busiest core
/// reaches this: from 2 MiB with four a core, from 2.67 MiB with three (two
/// a core would give the 4 MiB of [`STORED_PULLED_OUTPUT_SHARED_CORES`]).
/// Its blocks are then at least the transport's default pull threshold
/// there ([`gw_transport::shm::DEFAULT_PULL_BYTES`], checked below), so
/// every fan-out block is pulled, read out of its owner whether the owner
/// is scheduled or not; along the ring each of the n-1 steps waits for the
/// next rank to run, and the more ranks a core runs the longer that wait.
/// 2026-12-06 VM (fifth session), shm, `ab-builds.py`, fan-out against the
/// ring, old/new, median [rounds]: 8 ranks (4 a core) at 2 MiB 1.56, 1.70
/// [1.12-1.75], 1.67 [1.20-1.75], 1.57 [1.40-2.00] and 1.83 [1.36-2.32] in
/// five runs; 6 ranks (3 a core) at 3 MiB 1.71, 1.23, 1.35 and 1.46
/// [1.12-1.72], at 4 MiB less 64 bytes 1.61 [1.18-1.87], but at 2 MiB 1.64,
/// 0.86 [0.63-1.81] and 1.09 [0.81-1.20]; 5 ranks (3 on the busiest core)
/// at 2.5 MiB 1.19 and 1.28, at 2 MiB 0.99 [0.84-1.71]. So at three a core
/// the threshold, 2.67 MiB, lies between the coin toss at 2 MiB and the
/// gains at 2.5 and 3 MiB, on the safe side. Below 2 MiB it did
/// not hold: blocks of 256 KiB at 5 and 6 ranks (1.25 and 1.5 MiB)
/// 0.75-0.88 and 1.05-1.76; smaller blocks, through the slots, 0.97-1.02
/// at 8 ranks and 1 MiB; pulled with `GW_SHM_PULL_BYTES` lowered, 1 MiB
/// 1.24 but 256 and 512 KiB 0.53 and 0.77. Broadcasts keep 4 MiB: the star
/// below it lost at 8 ranks (0.74-0.84 from 512 KiB to 2 MiB) and at 4
/// (0.77 and 0.91 at 512 KiB and 1 MiB).
pub const FAN_OUT_GATHER_CORE_BYTES: usize = 8 << 20;

/// The least output from which an all-gather fans out where the busiest
/// core runs `ranks_per_core` ranks (see [`FAN_OUT_GATHER_CORE_BYTES`]).
pub fn fan_out_gather_least(ranks_per_core: f64) -> usize {
    ((FAN_OUT_GATHER_CORE_BYTES as f64 / ranks_per_core) as usize)
        .min(STORED_PULLED_OUTPUT_SHARED_CORES)
}

const _: () = assert!(
    FAN_OUT_GATHER_CORE_BYTES / FAN_OUT_RANKS_PER_CORE_MAX / FAN_OUT_MAX_RANKS
        >= gw_transport::shm::DEFAULT_PULL_BYTES,
    "a crowded fan-out all-gather's blocks must be pulled"
);

/// The most ranks to a core for which [`fans_out`] holds. 2026-12-06 VM
/// (fourth session), a build allowing 4 a core against one allowing 2,
/// `ab-builds.py`, old/new at 4 / 16 / 64 MiB of output: 8 ranks (4 a core)
/// all-gather 1.43 / 1.29 / 1.03 (4 rounds; 4 and 16 MiB every round at
/// least 1.15), broadcast (the star, through the slots) 1.14 / 1.18 / 1.16;
/// 6 ranks (3 a core) all-gather 1.17 / 1.10 / 1.12 (3 rounds). More ranks
/// to a core were not measured and keep the ring and the chain.
pub const FAN_OUT_RANKS_PER_CORE_MAX: usize = 4;

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    Api,
    Env(&'static str),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::Api => f.write_str("API"),
            Source::Env(v) => write!(f, "env {v}"),
        }
    }
}

/// A value and its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Setting<T> {
    fn default(value: T) -> Self {
        Setting {
            value,
            source: Source::Default,
        }
    }

    /// Sets the value from the API.
    pub fn set(&mut self, value: T) {
        self.value = value;
        self.source = Source::Api;
    }
}

/// Which transport carries traffic to each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory to same-host peers, TCP to the rest.
    Auto,
    /// TCP to every peer.
    Tcp,
    /// Shared memory to every peer; an error if a peer is on another host.
    Shm,
    /// libfabric to every peer (`GW_OFI_PROVIDER` picks the provider).
    Ofi,
    /// gradwire's own verbs backend (`gw-verbs`); never chosen by `auto`.
    Verbs,
}

/// When a persistent all-reduce moves its data by one-sided writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneSided {
    /// Where every peer's transport writes in hardware (an RDMA NIC);
    /// elsewhere two-sided, which was as fast or faster where the writes
    /// are emulated (docs/performance.md).
    Auto,
    /// Wherever every peer's transport has one-sided writes at all.
    Always,
    /// Never: always two-sided.
    Never,
}

impl OneSided {
    pub fn parse(s: &str) -> Option<OneSided> {
        match s {
            "auto" => Some(OneSided::Auto),
            "1" => Some(OneSided::Always),
            "0" => Some(OneSided::Never),
            _ => None,
        }
    }
}

impl TransportChoice {
    pub fn parse(s: &str) -> Option<TransportChoice> {
        match s {
            "auto" => Some(TransportChoice::Auto),
            "tcp" => Some(TransportChoice::Tcp),
            "shm" => Some(TransportChoice::Shm),
            "ofi" => Some(TransportChoice::Ofi),
            "verbs" => Some(TransportChoice::Verbs),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Shm => "shm",
            TransportChoice::Ofi => "ofi",
            TransportChoice::Verbs => "verbs",
        }
    }
}

/// Every setting of a communicator (see the module comment).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `GW_TRANSPORT`: auto, tcp, shm, ofi or verbs.
    pub transport: Setting<TransportChoice>,
    /// `GW_TIMEOUT` (seconds): deadline of init and of every operation.
    pub timeout: Setting<Duration>,
    /// `GW_LANES`: TCP sockets per peer.
    pub lanes: Setting<usize>,
    /// `GW_SEGMENT_BYTES`: pipeline segment of the algorithms, and TCP frame
    /// size. Left at its default it depends on the link (see
    /// [`Config::segment_bytes_for`]).
    pub segment_bytes: Setting<usize>,
    /// `GW_PIPELINE_DEPTH`: messages in flight per stream. Left
    /// at its default it depends on whether ranks share cores (see
    /// [`Config::pipeline_depth_for`]).
    pub pipeline_depth: Setting<usize>,
    /// `GW_ALGO`: force an all-reduce algorithm (ring, tree, rhd, rd or hier).
    pub algo: Setting<Option<Algo>>,
    /// `GW_TREE_THRESHOLD` (bytes): all-reduces up to this size use the tree.
    pub tree_threshold: Setting<usize>,
    /// `GW_FUSION_BYTES`: size of the fusion buffer that packs many small
    /// tensors into one all-reduce.
    pub fusion_bytes: Setting<usize>,
    /// `GW_SOCKET_IFNAME`: interface the TCP data plane listens on.
    pub socket_ifname: Setting<Option<String>>,
    /// `GW_OFI_PROVIDER`: the libfabric provider of `GW_TRANSPORT=ofi`
    /// (unset: the best available).
    pub ofi_provider: Setting<Option<String>>,
    /// `GW_SOCKET_SEND_BUFFER_BYTES`: send buffer of every TCP socket; 0
    /// leaves it to the kernel's autotuning.
    pub socket_send_buffer_bytes: Setting<usize>,
    /// `GW_SOCKET_RECV_BUFFER_BYTES`: receive buffer of every TCP socket; 0
    /// leaves it to the kernel's autotuning.
    pub socket_recv_buffer_bytes: Setting<usize>,
    /// `GW_EAGER_FRAMES`: frames of each peer buffered ahead of their
    /// receives (each up to the transport's frame size); the credits every
    /// sender to this rank gets. Past them a message is announced and sent
    /// once its receive is posted.
    pub eager_frames: Setting<usize>,
    /// `GW_EAGER_SMALL`: small buffers of each TCP peer, for messages of
    /// at most `gw_transport::SMALL_FRAME_BYTES`, which take these credits
    /// instead of frame credits (none where `GW_EAGER_FRAMES` is 0).
    pub eager_small: Setting<usize>,
    /// `GW_SPIN_US`: how long the engine polls before it sleeps.
    pub spin_us: Setting<u64>,
    /// `GW_INLINE`: a caller blocked on its operation turns the engine
    /// itself (1) or leaves it to the engine thread (0).
    pub inline: Setting<bool>,
    /// `GW_ONE_SIDED`: when persistent all-reduces move data by one-sided
    /// writes: `auto` (where they are done in hardware), 1 (wherever a
    /// transport has them) or 0 (never).
    pub one_sided: Setting<OneSided>,
    /// `GW_HOST_ROUND_BYTES`: persistent all-reduces of at most this many
    /// bytes, among ranks that all share one host over shared memory, run
    /// through one region every rank maps (`host_rounds.rs`); 0: never.
    pub host_round_bytes: Setting<usize>,
    /// `GW_HOST_COLL_BYTES`: blocking collectives whose slot payload is at
    /// most this many bytes, among ranks that all share one host over
    /// shared memory, run through one region every rank maps
    /// (`host_coll.rs`); 0: never.
    pub host_coll_bytes: Setting<usize>,
    /// `GW_SHM_SLOT_BYTES`: payload per shared-memory ring slot.
    pub shm_slot_bytes: Setting<usize>,
    /// `GW_SHM_SLOTS`: slots per shared-memory ring.
    pub shm_slots: Setting<usize>,
    /// `GW_SHM_PULL_BYTES`: shared-memory messages from this size on are
    /// copied once, by the receiver, out of the sender's process (0: never).
    /// Left at its default, it applies where a host runs more ranks than it
    /// has cores, but for large broadcasts and all-gathers at two ranks a
    /// core at most; with a core per rank a smaller threshold and a region
    /// limit do (see [`Config::shm_pulls_for`]).
    pub shm_pull_bytes: Setting<usize>,
    /// `GW_SHM_ADAPT`: a collective's shared-memory segment, or a stored
    /// message (point-to-point, with a core per rank) of at least 256 KiB, that
    /// `GW_SHM_PULL_BYTES`'s rules would pull goes through the slots where they are measured to
    /// cost less (1, the default; only where every rank of the host has a
    /// core), or the rules alone decide (0).
    pub shm_adapt: Setting<bool>,
    /// `GW_FANOUT`: where all ranks share one host's memory and outnumber
    /// its cores, a large all-gather or broadcast of more than two ranks
    /// sends each block straight from its owner to every rank at once (1,
    /// the default, where [`fans_out`]) instead of along the ring or the
    /// chain (0), so that no receive waits for a chain of ranks to be
    /// scheduled.
    pub fan_out: Setting<bool>,
    /// `GW_TRACE`: a Chrome-trace file every rank appends its timeline to
    /// when its communicator closes (see `trace.rs`); unset: no tracing.
    pub trace: Setting<Option<String>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            transport: Setting::default(TransportChoice::Auto),
            timeout: Setting::default(Duration::from_secs(60)),
            lanes: Setting::default(2),
            // 128 KiB: a segment and its scratch slot stay in a core's L2; on this
            // 2-core VM it beat 512 KiB at 16-256 MiB over shm (2.0-2.7 vs
            // 1.6-1.8 GB/s at 64 MiB) and steadied TCP at 1 MiB. Collectives
            // over TCP use TCP_SEGMENT_BYTES instead.
            segment_bytes: Setting::default(128 * 1024),
            pipeline_depth: Setting::default(DEPTH_SHARED_CORES),
            algo: Setting::default(None),
            tree_threshold: Setting::default(64 * 1024),
            fusion_bytes: Setting::default(64 << 20),
            socket_ifname: Setting::default(None),
            ofi_provider: Setting::default(None),
            trace: Setting::default(None),
            socket_send_buffer_bytes: Setting::default(
                gw_transport::tcp::DEFAULT_SEND_BUFFER_BYTES,
            ),
            socket_recv_buffer_bytes: Setting::default(
                gw_transport::tcp::DEFAULT_RECV_BUFFER_BYTES,
            ),
            eager_frames: Setting::default(gw_transport::DEFAULT_EAGER_FRAMES),
            eager_small: Setting::default(gw_transport::DEFAULT_SMALL_FRAMES),
            spin_us: Setting::default(100),
            inline: Setting::default(true),
            one_sided: Setting::default(OneSided::Auto),
            host_round_bytes: Setting::default(crate::host_rounds::DEFAULT_MAX_BYTES),
            host_coll_bytes: Setting::default(crate::host_coll::DEFAULT_MAX_BYTES),
            shm_slot_bytes: Setting::default(512 * 1024),
            shm_slots: Setting::default(8),
            shm_pull_bytes: Setting::default(gw_transport::shm::DEFAULT_PULL_BYTES),
            shm_adapt: Setting::default(true),
            fan_out: Setting::default(true),
        }
    }
}

fn env_override<T>(
    s: &mut Setting<T>,
    var: &'static str,
    lookup: &dyn Fn(&str) -> Option<String>,
    parse: impl Fn(&str) -> Option<T>,
    expect: &str,
) -> Result<()> {
    if let Some(v) = lookup(var) {
        let v = v.trim().to_string();
        if v.is_empty() {
            return Ok(());
        }
        s.value =
            parse(&v).ok_or_else(|| Error::Config(format!("{var}={v:?}: expected {expect}")))?;
        s.source = Source::Env(var);
    }
    Ok(())
}

fn zero_or_one(v: &str) -> Option<bool> {
    match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

fn positive<T: std::str::FromStr + PartialOrd + Default>(v: &str) -> Option<T> {
    v.parse::<T>().ok().filter(|x| *x > T::default())
}

impl Config {
    /// Applies `GW_*` overrides from the process environment.
    pub fn apply_env(&mut self) -> Result<()> {
        self.apply_env_from(&|k| std::env::var(k).ok())
    }

    /// Applies overrides from any variable lookup (tests pass a map).
    pub fn apply_env_from(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        env_override(
            &mut self.transport,
            "GW_TRANSPORT",
            env,
            TransportChoice::parse,
            "auto, tcp, shm, ofi or verbs",
        )?;
        env_override(
            &mut self.timeout,
            "GW_TIMEOUT",
            env,
            |v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
                    .map(Duration::from_secs_f64)
            },
            "a positive number of seconds",
        )?;
        env_override(
            &mut self.lanes,
            "GW_LANES",
            env,
            |v| positive::<usize>(v).filter(|n| *n <= 64),
            "1..=64",
        )?;
        env_override(
            &mut self.segment_bytes,
            "GW_SEGMENT_BYTES",
            env,
            |v| positive::<usize>(v).filter(|n| *n >= 64 && *n <= 1 << 30),
            "64..=1073741824 bytes",
        )?;
        env_override(
            &mut self.pipeline_depth,
            "GW_PIPELINE_DEPTH",
            env,
            |v| positive::<usize>(v).filter(|n| *n <= MAX_DEPTH),
            &format!("1..={MAX_DEPTH}"),
        )?;
        env_override(
            &mut self.algo,
            "GW_ALGO",
            env,
            |v| {
                if v == "auto" {
                    Some(None)
                } else {
                    Algo::parse(v).map(Some)
                }
            },
            "ring, tree, rhd, hier or auto",
        )?;
        env_override(
            &mut self.tree_threshold,
            "GW_TREE_THRESHOLD",
            env,
            |v| v.parse().ok(),
            "a byte count",
        )?;
        env_override(
            &mut self.fusion_bytes,
            "GW_FUSION_BYTES",
            env,
            |v| positive::<usize>(v).filter(|n| *n <= 1 << 34),
            "1..=17179869184 bytes",
        )?;
        env_override(
            &mut self.socket_ifname,
            "GW_SOCKET_IFNAME",
            env,
            |v| Some(Some(v.to_string())),
            "an interface name",
        )?;
        env_override(
            &mut self.trace,
            "GW_TRACE",
            env,
            |v| (!v.is_empty()).then(|| Some(v.to_string())),
            "a file path",
        )?;
        env_override(
            &mut self.ofi_provider,
            "GW_OFI_PROVIDER",
            env,
            |v| (!v.is_empty()).then(|| Some(v.to_string())),
            "a libfabric provider name such as tcp;ofi_rxm",
        )?;
        // One variable set both buffers until the send buffer had to be much
        // smaller than the receive buffer; silently ignoring it would leave
        // a user believing their setting holds.
        if env("GW_SOCKET_BUFFER_BYTES").is_some_and(|v| !v.trim().is_empty()) {
            return Err(Error::Config(
                "GW_SOCKET_BUFFER_BYTES is no longer read: set GW_SOCKET_SEND_BUFFER_BYTES \
                 and GW_SOCKET_RECV_BUFFER_BYTES instead"
                    .into(),
            ));
        }
        for (setting, var) in [
            (
                &mut self.socket_send_buffer_bytes,
                "GW_SOCKET_SEND_BUFFER_BYTES",
            ),
            (
                &mut self.socket_recv_buffer_bytes,
                "GW_SOCKET_RECV_BUFFER_BYTES",
            ),
        ] {
            env_override(
                setting,
                var,
                env,
                |v| {
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n == 0 || (4096..=1 << 30).contains(n))
                },
                "0 (the kernel's autotuning) or 4096..=1073741824 bytes",
            )?;
        }
        env_override(
            &mut self.eager_frames,
            "GW_EAGER_FRAMES",
            env,
            |v| v.parse::<usize>().ok().filter(|n| *n <= 1024),
            "0..=1024 frames",
        )?;
        env_override(
            &mut self.eager_small,
            "GW_EAGER_SMALL",
            env,
            |v| v.parse::<usize>().ok().filter(|n| *n <= 4096),
            "0..=4096 small buffers",
        )?;
        env_override(
            &mut self.spin_us,
            "GW_SPIN_US",
            env,
            |v| v.parse().ok(),
            "microseconds",
        )?;
        env_override(&mut self.inline, "GW_INLINE", env, zero_or_one, "0 or 1")?;
        env_override(
            &mut self.one_sided,
            "GW_ONE_SIDED",
            env,
            OneSided::parse,
            "auto, 0 or 1",
        )?;
        env_override(
            &mut self.host_round_bytes,
            "GW_HOST_ROUND_BYTES",
            env,
            |v| v.parse::<usize>().ok().filter(|n| *n <= 1 << 30),
            "0..=1073741824 bytes",
        )?;
        env_override(
            &mut self.host_coll_bytes,
            "GW_HOST_COLL_BYTES",
            env,
            |v| v.parse::<usize>().ok().filter(|n| *n <= 1 << 20),
            "0..=1048576 bytes",
        )?;
        env_override(
            &mut self.shm_slot_bytes,
            "GW_SHM_SLOT_BYTES",
            env,
            |v| positive::<usize>(v).filter(|n| *n >= 4096 && *n <= 1 << 30),
            "4096..=1073741824 bytes",
        )?;
        env_override(
            &mut self.shm_slots,
            "GW_SHM_SLOTS",
            env,
            |v| positive::<usize>(v).filter(|n| *n >= 2 && *n <= 4096),
            "2..=4096",
        )?;
        env_override(
            &mut self.shm_pull_bytes,
            "GW_SHM_PULL_BYTES",
            env,
            |v| v.parse().ok(),
            "bytes (0 turns single-copy pulls off)",
        )?;
        env_override(
            &mut self.shm_adapt,
            "GW_SHM_ADAPT",
            env,
            zero_or_one,
            "0 or 1",
        )?;
        env_override(&mut self.fan_out, "GW_FANOUT", env, zero_or_one, "0 or 1")?;
        Ok(())
    }

    /// Whether shared memory chooses between a pull and the slots by
    /// measured cost on a host running `local_ranks` ranks on `cores`
    /// cores: `GW_SHM_ADAPT` where set; by default only where every rank
    /// has a core, since where ranks share cores the measured choice lost
    /// as often as it won (docs/performance.md, "Pull or slots, measured").
    pub fn shm_adapt_for(&self, local_ranks: usize, cores: usize) -> bool {
        match self.shm_adapt.source {
            Source::Default => self.shm_adapt.value && local_ranks <= cores,
            _ => self.shm_adapt.value,
        }
    }

    /// The pipeline segment (and TCP frame) of collectives bound by `link`:
    /// `GW_SEGMENT_BYTES` where set, else its default over shared memory and
    /// [`TCP_SEGMENT_BYTES`] over TCP. Every rank derives the same `link`
    /// (the communicator's slowest), so every rank cuts messages alike.
    pub fn segment_bytes_for(&self, link: LinkKind) -> usize {
        match (self.segment_bytes.source, link) {
            (Source::Default, LinkKind::Tcp) => TCP_SEGMENT_BYTES,
            _ => self.segment_bytes.value,
        }
    }

    /// The pipeline depth ([`OpSpec::depth`](crate::algo::OpSpec::depth)) of a
    /// communicator whose host runs `local_ranks` ranks on `cores` cores:
    /// `GW_PIPELINE_DEPTH` where set, else [`DEPTH_CORE_PER_RANK`] with a core
    /// per rank and [`DEPTH_SHARED_CORES`] without.
    pub fn pipeline_depth_for(&self, local_ranks: usize, cores: usize) -> usize {
        match self.pipeline_depth.source {
            Source::Default if local_ranks <= cores => DEPTH_CORE_PER_RANK,
            _ => self.pipeline_depth.value,
        }
    }

    /// Which shared-memory messages are pulled in one copy on a host that
    /// runs `local_ranks` ranks on `cores` cores. `GW_SHM_PULL_BYTES` where
    /// set, for every message out of any region; else, with a core per
    /// rank, [`PULL_BYTES_CORE_PER_RANK`] out of regions under
    /// [`PULL_REGION_MAX_CORE_PER_RANK`] and
    /// [`P2P_PULL_BYTES_CORE_PER_RANK`] for point-to-point messages, and
    /// without, the default threshold for everything out of any region but
    /// [`STORED_PULL_BYTES_SHARED_CORES`] for stored messages where a core
    /// runs at most [`STORED_PULLS_RANKS_PER_CORE`] ranks.
    pub fn shm_pulls_for(&self, local_ranks: usize, cores: usize) -> ShmPulls {
        match self.shm_pull_bytes.source {
            Source::Default if local_ranks <= cores => ShmPulls {
                bytes: PULL_BYTES_CORE_PER_RANK,
                region_max: PULL_REGION_MAX_CORE_PER_RANK,
                p2p_bytes: P2P_PULL_BYTES_CORE_PER_RANK,
            },
            source => ShmPulls {
                bytes: self.shm_pull_bytes.value,
                region_max: usize::MAX,
                p2p_bytes: if source == Source::Default
                    && local_ranks.div_ceil(cores.max(1)) <= STORED_PULLS_RANKS_PER_CORE
                {
                    STORED_PULL_BYTES_SHARED_CORES
                } else {
                    self.shm_pull_bytes.value
                },
            },
        }
    }

    /// One line per setting: name, value, source.
    pub fn describe(&self) -> Vec<String> {
        fn line<T: fmt::Debug>(name: &str, s: &Setting<T>) -> String {
            format!("{name:<18} = {:?} ({})", s.value, s.source)
        }
        vec![
            line("GW_TRANSPORT", &self.transport),
            line("GW_TIMEOUT", &self.timeout),
            line("GW_LANES", &self.lanes),
            match self.segment_bytes.source {
                Source::Default => format!(
                    "{:<18} = {} over shm, {TCP_SEGMENT_BYTES} over TCP (default)",
                    "GW_SEGMENT_BYTES", self.segment_bytes.value
                ),
                _ => line("GW_SEGMENT_BYTES", &self.segment_bytes),
            },
            match self.pipeline_depth.source {
                Source::Default => format!(
                    "{:<18} = {DEPTH_CORE_PER_RANK} with a core per rank, {} where ranks share cores (default)",
                    "GW_PIPELINE_DEPTH", self.pipeline_depth.value
                ),
                _ => line("GW_PIPELINE_DEPTH", &self.pipeline_depth),
            },
            line("GW_ALGO", &self.algo),
            line("GW_TREE_THRESHOLD", &self.tree_threshold),
            line("GW_FUSION_BYTES", &self.fusion_bytes),
            line("GW_SOCKET_IFNAME", &self.socket_ifname),
            line("GW_OFI_PROVIDER", &self.ofi_provider),
            line(
                "GW_SOCKET_SEND_BUFFER_BYTES",
                &self.socket_send_buffer_bytes,
            ),
            line(
                "GW_SOCKET_RECV_BUFFER_BYTES",
                &self.socket_recv_buffer_bytes,
            ),
            line("GW_EAGER_FRAMES", &self.eager_frames),
            line("GW_EAGER_SMALL", &self.eager_small),
            line("GW_SPIN_US", &self.spin_us),
            line("GW_INLINE", &self.inline),
            line("GW_ONE_SIDED", &self.one_sided),
            line("GW_HOST_ROUND_BYTES", &self.host_round_bytes),
            line("GW_HOST_COLL_BYTES", &self.host_coll_bytes),
            line("GW_SHM_SLOT_BYTES", &self.shm_slot_bytes),
            line("GW_SHM_SLOTS", &self.shm_slots),
            match self.shm_pull_bytes.source {
                Source::Default => format!(
                    "{:<18} = {PULL_BYTES_CORE_PER_RANK} out of regions under \
                     {PULL_REGION_MAX_CORE_PER_RANK} and {P2P_PULL_BYTES_CORE_PER_RANK} for \
                     point-to-point with a core per rank, {} where ranks share cores but \
                     {STORED_PULL_BYTES_SHARED_CORES} for broadcasts and all-gathers from \
                     {STORED_PULLED_OUTPUT_SHARED_CORES} of output at \
                     {STORED_PULLS_RANKS_PER_CORE} ranks a core at most (default)",
                    "GW_SHM_PULL_BYTES", self.shm_pull_bytes.value
                ),
                _ => line("GW_SHM_PULL_BYTES", &self.shm_pull_bytes),
            },
            match self.shm_adapt.source {
                Source::Default => format!(
                    "{:<18} = 1 where every rank of the host has a core, else 0 (default)",
                    "GW_SHM_ADAPT"
                ),
                _ => line("GW_SHM_ADAPT", &self.shm_adapt),
            },
            match self.fan_out.source {
                Source::Default => format!(
                    "{:<18} = 1 over shared memory on 3 to {FAN_OUT_MAX_RANKS} ranks sharing \
                     cores, at most {FAN_OUT_RANKS_PER_CORE_MAX} a core, from \
                     {STORED_PULLED_OUTPUT_SHARED_CORES} bytes of output, an all-gather \
                     with more than {STORED_PULLS_RANKS_PER_CORE} a core from \
                     {FAN_OUT_GATHER_CORE_BYTES} over the ranks a core runs (default)",
                    "GW_FANOUT"
                ),
                _ => line("GW_FANOUT", &self.fan_out),
            },
            line("GW_TRACE", &self.trace),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn only_a_two_rank_all_gather_with_an_output_between_the_bounds_is_pulled() {
        let (lo, hi) = (PULL_REGION_MAX_CORE_PER_RANK, ALL_GATHER_PULLED_BELOW);
        assert!(all_gather_pulled(2, lo));
        assert!(all_gather_pulled(2, hi - 1));
        assert!(
            !all_gather_pulled(2, lo - 1),
            "the region rule pulls those already"
        );
        assert!(
            !all_gather_pulled(2, hi),
            "the slots' streaming copy wins there"
        );
        assert!(!all_gather_pulled(3, 8 << 20));
        assert!(!all_gather_pulled(4, 8 << 20));
    }

    #[test]
    fn where_cores_are_shared_large_broadcasts_and_all_gathers_are_stored_but_the_star() {
        let big = STORED_PULLED_OUTPUT_SHARED_CORES;
        let hint = hint_where_cores_shared;
        assert_eq!(hint(OpKind::AllGather, big, false), Some(SendHint::Stored));
        assert_eq!(hint(OpKind::AllGather, big, true), Some(SendHint::Stored));
        assert_eq!(
            hint(OpKind::Broadcast, big, false),
            Some(SendHint::Stored),
            "the chain"
        );
        assert_eq!(
            hint(OpKind::Broadcast, big, true),
            Some(SendHint::Pushed),
            "the star's receivers would all pin the root's pages at once"
        );
        assert_eq!(hint(OpKind::AllGather, big - 1, false), None);
        assert_eq!(
            hint(OpKind::AllGather, fan_out_gather_least(4.0), true),
            Some(SendHint::Stored),
            "a crowded fan-out all-gather's blocks are stored from 2 MiB"
        );
        assert_eq!(hint(OpKind::Broadcast, big - 1, false), None);
        assert_eq!(hint(OpKind::AllReduce, big, false), None);
        assert_eq!(hint(OpKind::Reduce, big, false), None);
    }

    #[test]
    fn all_gathers_send_whole_blocks_where_pulled_and_not_forwarded() {
        let (lo, hi) = (PULL_REGION_MAX_CORE_PER_RANK, ALL_GATHER_PULLED_BELOW);
        let whole =
            |ranks, link, per_core, out| all_gather_whole_blocks(ranks, link, per_core, out, false);
        assert!(whole(2, LinkKind::Shm, 1.0, lo));
        assert!(whole(2, LinkKind::Shm, 0.5, hi - 1));
        assert!(
            !whole(2, LinkKind::Shm, 1.0, lo - 1),
            "segments pulled one by one there"
        );
        assert!(
            !whole(2, LinkKind::Shm, 1.0, hi),
            "the slots stream it there"
        );
        assert!(
            !whole(2, LinkKind::Tcp, 1.0, lo),
            "TCP frames its own segments"
        );
        assert!(
            !whole(2, LinkKind::Shm, 2.0, lo),
            "not pulled where ranks share a core"
        );
        assert!(!whole(3, LinkKind::Shm, 1.0, lo));
        assert!(
            all_gather_whole_blocks(4, LinkKind::Shm, 2.0, 64 << 20, true),
            "a fan-out all-gather's blocks go whole"
        );
    }

    #[test]
    fn the_default_segment_depends_on_the_link_and_a_set_one_does_not() {
        let mut c = Config::default();
        assert_eq!(c.segment_bytes_for(LinkKind::Shm), 128 * 1024);
        assert_eq!(c.segment_bytes_for(LinkKind::Tcp), TCP_SEGMENT_BYTES);
        assert!(c.describe().iter().any(|l| l.contains("GW_SEGMENT_BYTES")
            && l.contains(&format!("{TCP_SEGMENT_BYTES} over TCP"))));
        c.apply_env_from(&env(&[("GW_SEGMENT_BYTES", "65536")]))
            .unwrap();
        assert_eq!(c.segment_bytes_for(LinkKind::Shm), 65536);
        assert_eq!(c.segment_bytes_for(LinkKind::Tcp), 65536);
        c.segment_bytes.set(4096);
        assert_eq!(c.segment_bytes_for(LinkKind::Tcp), 4096);
    }

    #[test]
    fn the_default_depth_depends_on_cores_per_rank_and_a_set_one_does_not() {
        let mut c = Config::default();
        assert_eq!(c.pipeline_depth_for(2, 2), DEPTH_CORE_PER_RANK);
        assert_eq!(c.pipeline_depth_for(4, 2), DEPTH_SHARED_CORES);
        assert!(
            c.describe().iter().any(|l| l.contains("GW_PIPELINE_DEPTH")
                && l.contains("where ranks share cores (default)"))
        );
        c.apply_env_from(&env(&[("GW_PIPELINE_DEPTH", "3")]))
            .unwrap();
        assert_eq!(c.pipeline_depth_for(2, 2), 3);
        assert_eq!(c.pipeline_depth_for(4, 2), 3);
        c.pipeline_depth.set(5);
        assert_eq!(c.pipeline_depth_for(1, 64), 5);
    }

    #[test]
    fn default_pulls_depend_on_cores_per_rank_and_a_set_threshold_does_not() {
        let mut c = Config::default();
        let everywhere = |n| ShmPulls {
            bytes: n,
            region_max: usize::MAX,
            p2p_bytes: n,
        };
        assert_eq!(
            c.shm_pulls_for(2, 2),
            ShmPulls {
                bytes: PULL_BYTES_CORE_PER_RANK,
                region_max: PULL_REGION_MAX_CORE_PER_RANK,
                p2p_bytes: P2P_PULL_BYTES_CORE_PER_RANK,
            }
        );
        // Two ranks to a core: stored messages from their own threshold.
        for (ranks, cores) in [(3, 2), (4, 2), (16, 8)] {
            assert_eq!(
                c.shm_pulls_for(ranks, cores),
                ShmPulls {
                    p2p_bytes: STORED_PULL_BYTES_SHARED_CORES,
                    ..everywhere(gw_transport::shm::DEFAULT_PULL_BYTES)
                },
                "{ranks} ranks on {cores} cores"
            );
        }
        // More: everything from the transport's threshold.
        for (ranks, cores) in [(5, 2), (8, 2), (17, 8)] {
            assert_eq!(
                c.shm_pulls_for(ranks, cores),
                everywhere(gw_transport::shm::DEFAULT_PULL_BYTES),
                "{ranks} ranks on {cores} cores"
            );
        }
        assert!(c.describe().iter().any(|l| l.contains("GW_SHM_PULL_BYTES")
            && l.contains("for point-to-point with a core per rank")
            && l.contains(
                "for broadcasts and all-gathers from 4194304 of output at 2 ranks a core at most"
            )));
        // Set, it is the threshold everywhere, out of any region; 0 is off.
        c.apply_env_from(&env(&[("GW_SHM_PULL_BYTES", "0")]))
            .unwrap();
        assert_eq!(c.shm_pulls_for(2, 2), everywhere(0));
        assert_eq!(c.shm_pulls_for(4, 2), everywhere(0));
        assert_eq!(c.shm_pulls_for(8, 2), everywhere(0));
        c.shm_pull_bytes.set(65536);
        assert_eq!(c.shm_pulls_for(1, 64), everywhere(65536));
    }

    #[test]
    fn large_all_gathers_and_broadcasts_fan_out_where_two_ranks_share_a_core() {
        let big = STORED_PULLED_OUTPUT_SHARED_CORES;
        // From 4 MiB the all-gather and the broadcast ask the same.
        let both = |n: usize, k: f64, bytes: usize| {
            let gathers = fans_out(n, k, bytes, true);
            assert_eq!(
                gathers,
                fans_out(n, k, bytes, false),
                "{n} ranks, {k} a core, {bytes} B"
            );
            gathers
        };
        assert!(both(4, 2.0, big) && both(3, 2.0, 64 << 20));
        assert!(both(FAN_OUT_MAX_RANKS, 2.0, big));
        assert!(
            !both(FAN_OUT_MAX_RANKS + 1, 2.0, big),
            "many ranks: the ring"
        );
        assert!(!both(2, 2.0, big), "two ranks: one exchange either way");
        assert!(!both(4, 2.0, big - 1), "small: the ring");
        assert!(!both(4, 1.0, big), "a core per rank: the ring");
        assert!(both(8, 4.0, big), "four a core: blocks of 512 KiB, pulled");
        assert!(both(6, 3.0, big));
        assert!(!both(8, 5.0, big), "more than four a core: the ring");
        let c = Config::default();
        assert!(c.fan_out.value);
        assert!(
            c.describe()
                .iter()
                .any(|l| l.contains("GW_FANOUT") && l.contains("(default)")),
            "{:?}",
            c.describe()
        );
        let mut c = Config::default();
        c.apply_env_from(&env(&[("GW_FANOUT", "0")])).unwrap();
        assert!(!c.fan_out.value);
        assert_eq!(c.fan_out.source, Source::Env("GW_FANOUT"));
    }

    #[test]
    fn crowded_all_gathers_fan_out_from_less_the_more_ranks_share_a_core() {
        let two_mib = 2 << 20;
        // 8 ranks, 4 a core: from 2 MiB of output; the broadcast from 4 MiB.
        assert!(fans_out(8, 4.0, two_mib, true));
        assert!(!fans_out(8, 4.0, two_mib - 1, true), "small: the ring");
        assert!(
            !fans_out(8, 4.0, two_mib, false),
            "the star waits for 4 MiB"
        );
        assert!(fans_out(8, 4.0, STORED_PULLED_OUTPUT_SHARED_CORES, false));
        // 7 ranks, 4 on the busiest core: blocks of 292 KiB, pulled.
        assert!(fans_out(7, 4.0, two_mib, true));
        // 6 and 5 ranks, 3 on the busiest core: from 8 MiB / 3.
        let third = (8 << 20) / 3;
        assert_eq!(fan_out_gather_least(3.0), third);
        assert_eq!(fan_out_gather_least(2.0), STORED_PULLED_OUTPUT_SHARED_CORES);
        for n in [5, 6] {
            assert!(fans_out(n, 3.0, third + 1, true), "{n} ranks");
            assert!(!fans_out(n, 3.0, two_mib, true), "{n} ranks");
            assert!(!fans_out(n, 3.0, third + 1, false), "{n} ranks");
        }
        // Two a core: 4 MiB for both.
        assert!(!fans_out(
            4,
            2.0,
            STORED_PULLED_OUTPUT_SHARED_CORES - 1,
            true
        ));
        assert!(!fans_out(8, 2.0, two_mib, true));
        // More than four a core: never.
        assert!(!fans_out(8, 5.0, 64 << 20, true));
    }

    #[test]
    fn measured_costs_choose_between_pull_and_slots_where_ranks_have_cores() {
        let c = Config::default();
        assert!(c.shm_adapt_for(2, 2) && c.shm_adapt_for(1, 64));
        assert!(!c.shm_adapt_for(3, 2) && !c.shm_adapt_for(8, 2));
        assert!(
            c.describe().iter().any(|l| l.contains("GW_SHM_ADAPT")
                && l.contains("where every rank of the host has a core"))
        );
        // Set, it holds everywhere.
        for (v, on) in [("0", false), ("1", true)] {
            let mut c = Config::default();
            c.apply_env_from(&env(&[("GW_SHM_ADAPT", v)])).unwrap();
            assert_eq!(c.shm_adapt.source, Source::Env("GW_SHM_ADAPT"));
            assert_eq!((c.shm_adapt_for(2, 2), c.shm_adapt_for(8, 2)), (on, on));
        }
    }

    #[test]
    fn env_overrides_api_and_records_source() {
        let mut c = Config::default();
        c.lanes.set(4);
        c.apply_env_from(&env(&[("GW_LANES", "3"), ("GW_TRANSPORT", "tcp")]))
            .unwrap();
        assert_eq!(c.lanes.value, 3);
        assert_eq!(c.lanes.source, Source::Env("GW_LANES"));
        assert_eq!(c.transport.value, TransportChoice::Tcp);
        assert_eq!(c.timeout.source, Source::Default);
        assert!(
            c.describe()
                .iter()
                .any(|l| l.contains("GW_LANES") && l.contains("env GW_LANES"))
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("GW_TRANSPORT", "udp"),
            ("GW_TIMEOUT", "-1"),
            ("GW_LANES", "0"),
            ("GW_ALGO", "butterfly"),
            ("GW_SHM_SLOTS", "1"),
            ("GW_SHM_ADAPT", "yes"),
            ("GW_FANOUT", "2"),
            ("GW_SOCKET_SEND_BUFFER_BYTES", "100"),
            ("GW_SOCKET_RECV_BUFFER_BYTES", "100"),
            ("GW_PIPELINE_DEPTH", "0"),
            ("GW_PIPELINE_DEPTH", "17"),
        ] {
            let e = Config::default()
                .apply_env_from(&env(&[(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(k) && e.contains(v), "{e}");
        }
    }

    /// The variable that once set both socket buffers is refused, naming
    /// the two that replaced it, rather than silently ignored.
    #[test]
    fn the_retired_socket_buffer_variable_is_refused() {
        let e = Config::default()
            .apply_env_from(&env(&[("GW_SOCKET_BUFFER_BYTES", "2097152")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GW_SOCKET_BUFFER_BYTES")
                && e.contains("GW_SOCKET_SEND_BUFFER_BYTES")
                && e.contains("GW_SOCKET_RECV_BUFFER_BYTES"),
            "{e}"
        );
        let mut c = Config::default();
        c.apply_env_from(&env(&[
            ("GW_SOCKET_SEND_BUFFER_BYTES", "0"),
            ("GW_SOCKET_RECV_BUFFER_BYTES", "1048576"),
        ]))
        .unwrap();
        assert_eq!(c.socket_send_buffer_bytes.value, 0);
        assert_eq!(c.socket_recv_buffer_bytes.value, 1 << 20);
    }

    #[test]
    fn api_setting_is_kept_without_env() {
        let mut c = Config::default();
        c.timeout.set(Duration::from_secs(5));
        c.apply_env_from(&env(&[])).unwrap();
        assert_eq!(c.timeout.value, Duration::from_secs(5));
        assert_eq!(c.timeout.source, Source::Api);
    }

    #[test]
    fn one_sided_modes_parse_and_bad_values_name_the_choices() {
        for (v, want) in [
            ("auto", OneSided::Auto),
            ("1", OneSided::Always),
            ("0", OneSided::Never),
        ] {
            let mut c = Config::default();
            c.apply_env_from(&env(&[("GW_ONE_SIDED", v)])).unwrap();
            assert_eq!(c.one_sided.value, want, "{v}");
        }
        assert_eq!(Config::default().one_sided.value, OneSided::Auto);
        let e = Config::default()
            .apply_env_from(&env(&[("GW_ONE_SIDED", "yes")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GW_ONE_SIDED") && e.contains("auto, 0 or 1"),
            "{e}"
        );
    }
}
