//! gwbench's command line.
//!
//! The flags are nccl-tests' (`-b -e -f -n -w -c -d -o -r -J`, with their long
//! spellings), plus `-a` for the all-reduce algorithm, so that a command line
//! written for nccl-tests carries over. clap derives the parser from [`Cli`];
//! [`parse`] adds the rules that span several flags and turns clap's
//! multi-line errors into the single line that completes `gwbench: error: `,
//! because under gwrun every rank's stderr is interleaved and a usage error
//! must stay readable.

use clap::builder::{PossibleValue, PossibleValuesParser, StyledStr, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use gw_cli::{Shell, err};
use gw_collectives::{Algo, DType, OpKind, RedOp};
use std::ffi::OsString;
use std::path::PathBuf;

/// clap would put `[OPTIONS]` before the collective, but [`parse`] wants the
/// collective first (as the old parser did), so the usage says so.
const USAGE: &str = "\
gwrun -n N gwbench COLLECTIVE [OPTIONS]
       gwrun -n 2 gwbench p2p [OPTIONS]
       gwrun -n 2 gwbench calibrate
       gwbench model --model NAME|FILE --cluster NAME|FILE [OPTIONS]
       gwbench completions SHELL";

/// What the flags' one-line help cannot say: how to read the output, and the
/// exit statuses scripts depend on.
const AFTER_HELP: &str = "\
Each collective runs out-of-place, then in-place, for every size. Sizes take
K, M or G suffixes (either case) = 2^10, 2^20, 2^30 bytes.

Output (rank 0 only; the nccl-tests table):
  size     bytes per rank: all-reduce, broadcast, reduce: count x type size;
           reduce-scatter: the send buffer (count x n); all-gather: the receive
           buffer (count x n). For those two the per-rank count is size / n
           rounded down to whole 16-byte chunks, as nccl-tests does.
  time     mean microseconds per call over -n iterations, the largest over ranks
  algbw    size / time, in GB/s (1 GB = 1e9 bytes)
  busbw    algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter and
           all-gather, x 1 for broadcast and reduce
  #wrong   wrong elements in the checked iteration, summed over ranks (N/A
           with -c 0)
  'Out of bounds values' counts the checks (rank x size x placement) that found
  wrong elements, as nccl-tests does; 'Avg bus bandwidth' is the mean busbw over
  every row, both placements.

p2p table: size, latency (us, half the round trip), one-way bandwidth and
bidirectional bandwidth (GB/s, both directions summed), #wrong bytes.

Shell completion: gwbench completions bash|zsh|fish|elvish|powershell prints a
script, e.g. gwbench completions bash > ~/.local/share/bash-completion/completions/gwbench

Exit status: 0 success; 1 wrong results or a library error (one line naming
it); 2 usage error.
";

/// gwbench's command line, as clap sees it.
///
/// The collective is a positional value rather than a subcommand so that one
/// `--help` page documents every flag, as nccl-tests' does.
#[derive(Debug, Parser)]
#[command(
    name = "gwbench",
    about = "gwbench - gradwire microbenchmarks in the style of nccl-tests",
    // Without this the doc comment above, written for readers of the code,
    // would become the long help's description.
    long_about = None,
    override_usage = USAGE,
    after_help = AFTER_HELP,
    // Not `args_conflicts_with_subcommands`: with it clap reports any stray
    // word after the collective as a misplaced subcommand. [`parse`] refuses
    // a command after a collective instead.
    subcommand_negates_reqs = true,
    // The old parser let a repeated flag's last value win; clap refuses
    // repeats unless told otherwise.
    args_override_self = true,
    // "help" is not a collective; `-h` and `--help` are the ways to ask.
    disable_help_subcommand = true
)]
pub struct Cli {
    /// The benchmark to run (each collective out-of-place, then in-place, for
    /// every size)
    #[arg(value_enum, required = true, value_name = "COLLECTIVE")]
    bench: Option<Bench>,

    #[command(flatten)]
    opts: Opts,

    #[command(subcommand)]
    sub: Option<Sub>,
}

/// The positional COLLECTIVE: the five collectives and p2p.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Bench {
    /// (also all_reduce)
    #[value(name = "allreduce", alias = "all_reduce")]
    AllReduce,
    /// (also reducescatter)
    #[value(name = "reduce_scatter", alias = "reducescatter")]
    ReduceScatter,
    /// (also all_gather)
    #[value(name = "allgather", alias = "all_gather")]
    AllGather,
    /// (also bcast)
    #[value(name = "broadcast", alias = "bcast")]
    Broadcast,
    #[value(name = "reduce")]
    Reduce,
    /// point-to-point on exactly 2 ranks: ping-pong latency (half the round
    /// trip), one-way bandwidth, and bidirectional bandwidth with sendrecv
    #[value(name = "p2p")]
    P2p,
}

impl Bench {
    fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    fn coll(self) -> Option<Coll> {
        Some(match self {
            Bench::AllReduce => Coll::AllReduce,
            Bench::ReduceScatter => Coll::ReduceScatter,
            Bench::AllGather => Coll::AllGather,
            Bench::Broadcast => Coll::Broadcast,
            Bench::Reduce => Coll::Reduce,
            Bench::P2p => return None,
        })
    }
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Measure the cost model's α and β over tcp and shm and γ of the
    /// reduction (on 2 ranks), and write them where rank 0 of every later job
    /// reads them (GW_MODEL_FILE, else ~/.cache/gradwire/model)
    Calibrate,
    /// Predict a synchronized SGD step of a model on a cluster (no ranks,
    /// no network: the performance model)
    Model(ModelOpts),
    /// Print a completion script for SHELL on stdout
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
}

impl Sub {
    fn name(&self) -> &'static str {
        match self {
            Sub::Calibrate => "calibrate",
            Sub::Model(_) => "model",
            Sub::Completions { .. } => "completions",
        }
    }
}

/// The flags p2p refuses: they describe a reduction or a root it does not have.
const COLL_ONLY: [&str; 6] = ["dtype", "redop", "root", "algo", "persistent", "register"];
/// The flags only p2p takes (its perftest shape).
const P2P_ONLY: [&str; 2] = ["bidir", "lat"];

/// The benchmark flags. Numeric ones accept a leading '-' as a value so that
/// `-e -5` is reported as a bad size rather than as a missing value.
#[derive(Debug, Args)]
struct Opts {
    /// Smallest size
    #[arg(
        short = 'b',
        long = "minbytes",
        value_name = "SIZE",
        default_value = "8",
        value_parser = parse_min_size,
        allow_negative_numbers = true,
    )]
    minbytes: usize,

    /// Largest size
    #[arg(
        short = 'e',
        long = "maxbytes",
        value_name = "SIZE",
        default_value = "64M",
        value_parser = parse_size,
        allow_negative_numbers = true,
    )]
    maxbytes: usize,

    /// Multiply the size by F between rows (at least 2)
    #[arg(
        short = 'f',
        long = "stepfactor",
        value_name = "F",
        default_value = "2",
        value_parser = parse_factor,
        allow_negative_numbers = true,
    )]
    stepfactor: usize,

    /// Timed iterations per size and placement (at least 1)
    #[arg(
        short = 'n',
        long = "iters",
        value_name = "N",
        default_value = "20",
        value_parser = parse_iters,
        allow_negative_numbers = true,
    )]
    iters: usize,

    /// Size each timed loop to about SECONDS instead (slowest rank; -n is then
    /// the least count)
    #[arg(
        short = 'T',
        long = "time",
        value_name = "SECONDS",
        value_parser = parse_seconds,
        allow_negative_numbers = true,
    )]
    time: Option<f64>,

    /// Untimed iterations before them
    #[arg(
        short = 'w',
        long = "warmup_iters",
        value_name = "N",
        default_value = "5",
        value_parser = parse_whole,
        allow_negative_numbers = true,
    )]
    warmup: usize,

    /// Check the result of one extra iteration per size and placement, outside
    /// the timed region
    #[arg(
        short = 'c',
        long = "check",
        value_name = "0|1",
        default_value = "1",
        value_parser = check_parser(),
        // A `bool` field would otherwise make -c a flag without a value.
        action = clap::ArgAction::Set,
    )]
    check: bool,

    /// Element type (not for p2p)
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPE",
        default_value = "float",
        value_parser = dtype_parser(),
    )]
    dtype: DType,

    /// Reduction of allreduce, reduce_scatter and reduce (avg needs a
    /// floating-point type); for p2p, perftest's operation: send, or write
    /// (one-sided, over any transport; read is not offered yet)
    #[arg(
        short = 'o',
        long = "op",
        value_name = "OP",
        default_value = "sum",
        value_parser = op_parser(),
    )]
    redop: OpArg,

    /// Root rank of broadcast and reduce (not for p2p)
    #[arg(
        short = 'r',
        long = "root",
        value_name = "R",
        default_value = "0",
        value_parser = parse_rank,
        allow_negative_numbers = true,
    )]
    root: u32,

    /// All-reduce algorithm; auto is the library's choice per size, which
    /// GW_ALGO and GW_TREE_THRESHOLD steer (not for p2p)
    // Spelled out in full so that clap takes `None` (auto) as a parsed value
    // instead of making the flag optional.
    #[arg(
        short = 'a',
        long = "algo",
        value_name = "ALGO",
        default_value = "auto",
        value_parser = algo_parser(),
    )]
    algo: std::option::Option<Algo>,

    /// Also write the results as JSON to FILE (rank 0)
    #[arg(short = 'J', long = "output_file", value_name = "FILE")]
    json: Option<PathBuf>,

    /// Time a persistent all-reduce (made once per size and placement, then
    /// started and waited for each iteration) instead of the ordinary call
    /// (allreduce only)
    #[arg(
        short = 'P',
        long = "persistent",
        value_name = "0|1",
        default_value = "0",
        value_parser = check_parser(),
        action = clap::ArgAction::Set,
    )]
    persistent: bool,

    /// With -P 1: the request allocates its own buffers, where every rank
    /// of the host maps them (Communicator::all_reduce_init_shared, as
    /// MPI_Win_allocate_shared or ncclMemAlloc), so that a round copies
    /// nothing in; the pattern is copied in, and the result out, outside
    /// the timed loop. Host buffers only
    #[arg(
        long = "shared",
        value_name = "0|1",
        default_value = "0",
        value_parser = check_parser(),
        action = clap::ArgAction::Set,
    )]
    shared: bool,

    /// Register the send and receive buffers once with the communicator
    /// before timing (NCCL's ncclCommRegister; gwCommRegister): calls then
    /// skip registering them, on transports where that pins memory (ofi,
    /// verbs). Host buffers only
    #[arg(
        long = "register",
        value_name = "0|1",
        default_value = "0",
        value_parser = check_parser(),
        action = clap::ArgAction::Set,
    )]
    register: bool,

    /// Put the host buffers on transparent huge pages (madvise, as perftest's
    /// --use_hugepages and numpy's large arrays): single-copy transfers
    /// between processes pin the peer's memory page by page, which costs
    /// less on 2 MiB pages. The header says what the kernel gave
    #[arg(
        long = "hugepages",
        value_name = "0|1",
        default_value = "0",
        value_parser = check_parser(),
        action = clap::ArgAction::Set,
    )]
    hugepages: bool,

    /// Where the buffers live: host memory, or CUDA device memory (GPU:
    /// the local rank modulo the GPUs; needs an NVIDIA driver and NVRTC).
    /// The collectives, and p2p's own table (its messages are staged
    /// blocking calls; not with --op)
    #[arg(long = "device", value_name = "host|cuda", default_value = "host",
          value_parser = ["host", "cuda"])]
    device: String,

    /// With p2p --op send, write or read: both ranks stream at once
    #[arg(long = "bidir")]
    bidir: bool,

    /// With p2p --op send, write or read: latency rows instead of bandwidth rows
    #[arg(long = "lat")]
    lat: bool,
}

/// The collectives gwbench measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
}

impl Coll {
    #[cfg(test)]
    pub const ALL: [Coll; 5] = [
        Coll::AllReduce,
        Coll::ReduceScatter,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::Reduce,
    ];

    /// The name gwbench prints (and the one `--help` lists).
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllGather => "allgather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
        }
    }

    pub fn kind(self) -> OpKind {
        match self {
            Coll::AllReduce => OpKind::AllReduce,
            Coll::ReduceScatter => OpKind::ReduceScatter,
            Coll::AllGather => OpKind::AllGather,
            Coll::Broadcast => OpKind::Broadcast,
            Coll::Reduce => OpKind::Reduce,
        }
    }

    /// Whether `-o` applies (the redop column is "none" otherwise).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether `-r` applies (the root column is -1 otherwise).
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// busbw / algbw on `n` ranks (nccl-tests' PERFORMANCE.md).
    pub fn busbw_factor(self, n: u32) -> f64 {
        let n = f64::from(n);
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::ReduceScatter | Coll::AllGather => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
        }
    }
}

/// The sizes of a run: `min`, `min·f`, `min·f²`, ... up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub min: usize,
    pub max: usize,
    pub factor: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            min: 8,
            max: 64 << 20,
            factor: 2,
        }
    }
}

impl Sizes {
    /// Every size, in order (the loop of nccl-tests' `TimeTest`).
    pub fn seq(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut s = self.min;
        while s <= self.max {
            out.push(s);
            match s.checked_mul(self.factor) {
                Some(next) if next > s => s = next,
                _ => break,
            }
        }
        out
    }
}

/// Options of a collective benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct CollOpts {
    pub coll: Coll,
    pub sizes: Sizes,
    pub iters: usize,
    /// `-T`: each timed loop about this many seconds (`iters` the least count).
    pub time: Option<f64>,
    pub warmup: usize,
    pub check: bool,
    pub dtype: DType,
    pub redop: RedOp,
    pub root: u32,
    /// `None` is `-a auto`.
    pub algo: Option<Algo>,
    pub json: Option<PathBuf>,
    /// `-P 1`: persistent all-reduce.
    pub persistent: bool,
    /// `--shared 1` (with `-P 1`): the request's own shared buffers.
    pub shared: bool,
    /// `--register 1`: buffers registered once before timing.
    pub register: bool,
    /// `--hugepages 1`: host buffers advised onto transparent huge pages.
    pub hugepages: bool,
    /// `--device cuda`: buffers in device memory.
    pub device: Device,
}

/// Where a benchmark's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Host,
    Cuda,
}

/// Options of the point-to-point benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct P2pOpts {
    pub sizes: Sizes,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub json: Option<PathBuf>,
    /// `--op` (with `--bidir`, `--lat`): perftest's tables instead of gwbench's.
    pub perftest: Option<Perftest>,
    /// `-T`: each of the three timed loops about this many seconds (`iters`
    /// the least count), as for collectives.
    pub time: Option<f64>,
    /// `--hugepages 1`: the buffers advised onto transparent huge pages.
    pub hugepages: bool,
    /// `--device cuda`: the messages sent from and received into device
    /// memory (gwbench's own table only).
    pub device: Device,
}

/// The operation of `p2p --op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pOp {
    Send,
    /// One-sided writes (`Communicator::put_init`), ib_write_bw's and ib_write_lat's.
    Write,
    /// One-sided reads (`Communicator::get_init`), ib_read_bw's and ib_read_lat's.
    Read,
}

/// `p2p --op OP [--bidir] [--lat]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perftest {
    pub op: P2pOp,
    pub bidir: bool,
    pub lat: bool,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `-h` or `--help`: the text to print.
    Help(String),
    Coll(CollOpts),
    P2p(P2pOpts),
    Calibrate,
    Model(ModelOpts),
    Completions(Shell),
}

/// `gwbench model`'s flags.
#[derive(Clone, Debug, PartialEq, Args)]
pub struct ModelOpts {
    /// A model file, or a shipped model: resnet50, resnet101, vgg16,
    /// bert-base, gpt2-small (needed unless --allreduce is given)
    #[arg(long, value_name = "FILE|NAME")]
    pub model: Option<String>,
    /// A cluster file, or a shipped cluster: reference, 10k, gavel, goyal
    #[arg(long, value_name = "FILE|NAME")]
    pub cluster: String,
    /// Samples per step over all devices (default: the model's batch per
    /// device times the devices)
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u64).range(1..))]
    pub global_batch: Option<u64>,
    /// How local batches are chosen: optperf (all ranks finish together) or
    /// even shares
    #[arg(long, value_enum, default_value = "optperf")]
    pub planner: PlannerArg,
    /// The all-reduce algorithm for every bucket; auto: the live chooser's
    #[arg(long, value_name = "ALGO", default_value = "auto", value_parser = PossibleValuesParser::new(["auto", "ring", "tree", "rhd", "hier", "rd"]))]
    pub algo: String,
    /// DDP's bucket cap (the first bucket is capped at 1M, as DDP does)
    #[arg(long, value_name = "N", default_value = "25M", value_parser = parse_size)]
    pub bucket_bytes: usize,
    /// Predict only all-reduces of these sizes over every device of the
    /// cluster (comma-separated), with nccl-tests' algbw and busbw
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = parse_size)]
    pub allreduce: Vec<usize>,
    /// One JSON object instead of the table
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlannerArg {
    Optperf,
    Even,
}

/// A command-line mistake; the text completes `gwbench: error: `.
pub use gw_cli::UsageError;

/// Parses a size: digits with an optional K, M or G (either case), powers of 1024.
pub fn parse_size(s: &str) -> Result<usize, String> {
    // clap quotes the value and the flag in front of this message.
    let bad = || "expected a size such as 8, 128K, 64M or 1G".to_string();
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1usize << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    // `usize::from_str` alone would also take a leading '+'.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits
        .parse::<usize>()
        .ok()
        .and_then(|d| d.checked_mul(mult))
        .ok_or_else(bad)
}

/// `-b`: a size of at least one byte (an empty row measures nothing).
fn parse_min_size(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        0 => Err("must be at least 1 byte".into()),
        n => Ok(n),
    }
}

fn parse_whole(s: &str) -> Result<usize, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected a whole number".into());
    }
    s.parse().map_err(|_| "too large".into())
}

/// `-f`: a factor of 1 would repeat one size forever.
fn parse_factor(s: &str) -> Result<usize, String> {
    match parse_whole(s)? {
        n if n < 2 => Err("must be at least 2".into()),
        n => Ok(n),
    }
}

/// `-n`: with no timed iteration there is no time to report.
fn parse_iters(s: &str) -> Result<usize, String> {
    match parse_whole(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `-T`: a duration a timed loop can be sized to.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= 3600.0 => Ok(t),
        Ok(_) => Err("must be more than 0 and at most 3600 seconds".into()),
        Err(_) => Err("expected a number of seconds".into()),
    }
}

fn parse_rank(s: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected a rank number".into());
    }
    s.parse().map_err(|_| "too large for a rank number".into())
}

fn check_parser() -> impl TypedValueParser<Value = bool> {
    PossibleValuesParser::new(["0", "1"]).map(|s| s == "1")
}

/// The types `-d` takes: nccl-tests' names, which `--help` lists, and the
/// aliases `DType::parse` also accepts, which it does not. `bytes` is left
/// out: nothing can be reduced or checked as untyped bytes.
const DTYPES: [(&str, &[&str]); 7] = [
    ("float", &["f32", "float32"]),
    ("double", &["f64", "float64"]),
    ("half", &["f16", "float16"]),
    ("bfloat16", &["bf16"]),
    ("int32", &["i32", "int"]),
    ("int64", &["i64"]),
    ("uint8", &["u8"]),
];

fn dtype_parser() -> impl TypedValueParser<Value = DType> {
    PossibleValuesParser::new(
        DTYPES.map(|(name, aliases)| PossibleValue::new(name).aliases(aliases)),
    )
    .try_map(|s| DType::parse(&s).ok_or_else(|| format!("unknown datatype '{s}'")))
}

/// What `-o/--op` names: a reduction (collectives, as in nccl-tests) or a
/// point-to-point operation (p2p, as in perftest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpArg {
    Red(RedOp),
    P2p(&'static str),
}

const P2P_OPS: [&str; 3] = ["send", "write", "read"];

fn op_parser() -> impl TypedValueParser<Value = OpArg> {
    let names = RedOp::ALL.map(RedOp::name).into_iter().chain(P2P_OPS);
    PossibleValuesParser::new(names).try_map(|s| {
        if let Some(p) = P2P_OPS.iter().find(|p| **p == s) {
            return Ok(OpArg::P2p(p));
        }
        RedOp::parse(&s)
            .map(OpArg::Red)
            .ok_or_else(|| format!("unknown op '{s}'"))
    })
}

fn algo_parser() -> impl TypedValueParser<Value = Option<Algo>> {
    let names = Algo::ALL.map(Algo::name).into_iter().chain(["auto"]);
    PossibleValuesParser::new(names).try_map(|s| match s.as_str() {
        "auto" => Ok(None),
        _ => Algo::parse(&s)
            .map(Some)
            .ok_or_else(|| format!("unknown algorithm '{s}'")),
    })
}

/// clap's error as one line ([`gw_cli::one_line`]) pointing at the help.
fn one_line(mut e: clap::Error) -> String {
    // clap tips "to pass '-x' as a value, use '-- -x'" for programs whose
    // positionals take free text; gwbench's only one is the collective, so
    // the tip would send the user from one error to another.
    if e.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::StyledStrs(tips)) = e.get(ContextKind::Suggested)
    {
        let kept: Vec<StyledStr> = tips
            .iter()
            .filter(|t| !t.to_string().contains("as a value, use '-- "))
            .cloned()
            .collect();
        e.insert(ContextKind::Suggested, ContextValue::StyledStrs(kept));
    }
    format!("{}; see gwbench --help", gw_cli::one_line(&e))
}

/// Parses gwbench's arguments (without `argv[0]`).
pub fn parse<S: Into<OsString>>(args: impl IntoIterator<Item = S>) -> Result<Command, UsageError> {
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if args.is_empty() {
        // clap would say only "<COLLECTIVE> was not provided"; a first-time
        // user is better served by the choices.
        let names: Vec<String> = Bench::value_variants()
            .iter()
            .filter_map(ValueEnum::to_possible_value)
            .map(|v| v.get_name().to_owned())
            .collect();
        return err(format!(
            "missing COLLECTIVE ({}) or command (calibrate, model, completions); see gwbench --help",
            names.join(", ")
        ));
    }
    // gwbench has always answered -h and --help wherever they appear, even
    // after a mistake (`gwbench alltoall --help`, `-J --help`): a command's
    // help when the first word names one.
    if let Some(text) = gw_cli::help_anywhere(Cli::command(), &args) {
        return Ok(Command::Help(text));
    }
    let argv = std::iter::once(OsString::from("gwbench")).chain(args.iter().cloned());
    let m = match Cli::command().try_get_matches_from(argv) {
        Ok(m) => m,
        // Help is the only "error" clap prints on stdout.
        Err(e) if !e.use_stderr() => return Ok(Command::Help(e.render().to_string())),
        Err(e) => return err(one_line(e)),
    };
    let cli = Cli::from_arg_matches(&m).map_err(|e| UsageError(one_line(e)))?;
    if let Some(first) = args[0].to_str().filter(|a| a.starts_with('-')) {
        return err(format!(
            "the first argument must be the COLLECTIVE, got option '{first}'; see gwbench --help"
        ));
    }
    if let (Some(bench), Some(sub)) = (cli.bench, &cli.sub) {
        let (name, bench) = (sub.name(), bench.name());
        return err(format!(
            "unexpected argument '{name}' after '{bench}': {name} is a command of its own, \
             not an option; see gwbench --help"
        ));
    }
    match cli.sub {
        Some(Sub::Calibrate) => return Ok(Command::Calibrate),
        Some(Sub::Model(m)) => {
            if m.model.is_none() && m.allreduce.is_empty() {
                return err(
                    "model: give --model FILE|NAME, or --allreduce SIZES; see gwbench model --help",
                );
            }
            if m.bucket_bytes == 0 {
                return err("model: --bucket-bytes must be at least 1");
            }
            return Ok(Command::Model(m));
        }
        Some(Sub::Completions { shell }) => return Ok(Command::Completions(shell)),
        None => {}
    }
    let Some(bench) = cli.bench else {
        return err("missing COLLECTIVE; see gwbench --help");
    };
    let o = cli.opts;
    if o.minbytes > o.maxbytes {
        return err(format!(
            "-b {} is larger than -e {}",
            o.minbytes, o.maxbytes
        ));
    }
    let sizes = Sizes {
        min: o.minbytes,
        max: o.maxbytes,
        factor: o.stepfactor,
    };
    if o.hugepages && o.device != "host" {
        return err("--hugepages 1 applies to host buffers, not --device cuda");
    }

    let Some(coll) = bench.coll() else {
        let cmd = Cli::command();
        let p2p_op = matches!(o.redop, OpArg::P2p(_));
        let given = COLL_ONLY
            .iter()
            .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
            .filter(|id| !(**id == "redop" && p2p_op))
            .find_map(|id| cmd.get_arguments().find(|a| a.get_id() == *id));
        if let Some(a) = given {
            let long = a.get_long().unwrap_or("?");
            return err(match a.get_short() {
                Some(c) => format!("-{c} (--{long}) does not apply to p2p"),
                None => format!("--{long} does not apply to p2p"),
            });
        }
        let op = match o.redop {
            OpArg::P2p(op) => Some(op),
            OpArg::Red(_) => None,
        };
        let perftest = match (op, o.bidir, o.lat) {
            (None, false, false) => None,
            (None, _, _) => return err("--bidir and --lat go with --op (p2p --op send)"),
            (Some("send" | "write" | "read"), true, true) => {
                return err("--lat takes no --bidir (perftest's latency tests are one way)");
            }
            (Some("send"), bidir, lat) => Some(Perftest {
                op: P2pOp::Send,
                bidir,
                lat,
            }),
            (Some("write"), bidir, lat) => Some(Perftest {
                op: P2pOp::Write,
                bidir,
                lat,
            }),
            (Some("read"), bidir, lat) => Some(Perftest {
                op: P2pOp::Read,
                bidir,
                lat,
            }),
            (Some(op), _, _) => {
                return err(format!(
                    "--op {op}: not a p2p operation (send, write, read)"
                ));
            }
        };
        if perftest.is_some() && o.time.is_some() {
            // perftest's tables count iterations (-n), as ib_write_bw's do.
            return err("-T (--time) goes with gwbench's own p2p table, not with --op");
        }
        if perftest.is_some() && o.device != "host" {
            // Device messages are staged blocking calls: no windows of
            // requests, no one-sided operations on device memory.
            return err(format!(
                "--device {} goes with gwbench's own p2p table, not with --op (perftest's tables measure host memory)",
                o.device
            ));
        }
        return Ok(Command::P2p(P2pOpts {
            sizes,
            iters: o.iters,
            warmup: o.warmup,
            check: o.check,
            json: o.json,
            perftest,
            time: o.time,
            hugepages: o.hugepages,
            device: device_of(&o.device),
        }));
    };
    let cmd = Cli::command();
    if let Some(a) = P2P_ONLY
        .iter()
        .filter(|id| m.value_source(id) == Some(ValueSource::CommandLine))
        .find_map(|id| cmd.get_arguments().find(|a| a.get_id() == *id))
    {
        return err(format!(
            "--{} applies to p2p only, not {}",
            a.get_long().unwrap_or("?"),
            coll.name()
        ));
    }
    let redop = match o.redop {
        OpArg::Red(r) => r,
        OpArg::P2p(op) => {
            return err(format!(
                "-o {op} is a p2p operation; {} takes a reduction (sum, prod, min, max, avg)",
                coll.name()
            ));
        }
    };
    if coll.reduces() && redop == RedOp::Avg && !o.dtype.is_float() {
        return err(format!(
            "-o avg needs a floating-point datatype, not {} (the library refuses integer averages)",
            o.dtype.name()
        ));
    }
    if let Some(a) = o.algo
        && coll != Coll::AllReduce
    {
        return err(format!(
            "-a {} applies to allreduce only; {} has a single algorithm (use -a auto)",
            a.name(),
            coll.name()
        ));
    }
    if o.persistent && coll != Coll::AllReduce {
        return err(format!(
            "-P 1 applies to allreduce only, not {}",
            coll.name()
        ));
    }
    if o.shared && !o.persistent {
        return err("--shared 1 applies to a persistent all-reduce (-P 1)");
    }
    if o.shared && o.algo.is_some() {
        return err("--shared 1 chooses where rounds run itself: use -a auto");
    }
    if o.shared && o.device != "host" {
        return err("--shared 1 applies to host buffers");
    }
    if o.register && o.device != "host" {
        return err("--register 1 applies to host buffers (device data is staged)");
    }
    Ok(Command::Coll(CollOpts {
        coll,
        sizes,
        iters: o.iters,
        time: o.time,
        warmup: o.warmup,
        check: o.check,
        dtype: o.dtype,
        redop: if coll.reduces() { redop } else { RedOp::None },
        root: if coll.rooted() { o.root } else { 0 },
        algo: o.algo,
        json: o.json,
        persistent: o.persistent,
        shared: o.shared,
        register: o.register,
        hugepages: o.hugepages,
        device: device_of(&o.device),
    }))
}

/// `--device`'s value (clap allows only host and cuda).
fn device_of(name: &str) -> Device {
    if name == "cuda" {
        Device::Cuda
    } else {
        Device::Host
    }
}

/// The completion script for `shell`, in memory: see
/// [`gw_cli::completion_script`]; the binary writes it.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    gw_cli::completion_script(shell, Cli::command())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, UsageError> {
        parse(s.split_whitespace())
    }

    fn coll(s: &str) -> CollOpts {
        match p(s) {
            Ok(Command::Coll(o)) => o,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn usage(s: &str) -> String {
        match p(s) {
            Err(e) => e.0,
            other => panic!("{s}: expected an error, got {other:?}"),
        }
    }

    /// Every flag gwbench has had, short and long; none may go missing.
    const FLAGS: [(char, &str); 12] = [
        ('T', "time"),
        ('b', "minbytes"),
        ('e', "maxbytes"),
        ('f', "stepfactor"),
        ('n', "iters"),
        ('w', "warmup_iters"),
        ('c', "check"),
        ('d', "datatype"),
        ('o', "op"),
        ('r', "root"),
        ('a', "algo"),
        ('J', "output_file"),
    ];

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("128k"), Ok(128 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        for bad in [
            "",
            "K",
            "1.5M",
            "-1",
            "+1",
            "1T",
            "1KB",
            " 8",
            "99999999999999999999",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size(&format!("{}G", usize::MAX)).is_err());
    }

    #[test]
    fn defaults_are_nccl_tests() {
        let o = coll("allreduce");
        assert_eq!(o.coll, Coll::AllReduce);
        assert_eq!(
            o.sizes,
            Sizes {
                min: 8,
                max: 64 << 20,
                factor: 2
            }
        );
        assert_eq!(o.sizes, Sizes::default());
        assert_eq!((o.iters, o.warmup, o.check), (20, 5, true));
        assert_eq!(
            (o.dtype, o.redop, o.root, o.algo),
            (DType::F32, RedOp::Sum, 0, None)
        );
        assert_eq!(o.json, None);
    }

    #[test]
    fn every_flag_short_long_and_glued() {
        let a = coll("reduce -b 1K -e 1M -f 4 -n 3 -w 0 -c 0 -d half -o max -r 1 -J out.json");
        let b = coll(
            "reduce --minbytes 1K --maxbytes=1M --stepfactor 4 --iters=3 --warmup_iters 0 --check=0 \
             --datatype half --op=max --root 1 --output_file out.json",
        );
        let c = coll("reduce -b1K -e1M -f4 -n3 -w0 -c0 -dhalf -omax -r1 -Jout.json");
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            a.sizes,
            Sizes {
                min: 1024,
                max: 1 << 20,
                factor: 4
            }
        );
        assert_eq!((a.iters, a.warmup, a.check), (3, 0, false));
        assert_eq!(a.time, None);
        assert_eq!(coll("allreduce -T 0.25").time, Some(0.25));
        assert_eq!(coll("allreduce --time=2").time, Some(2.0));
        assert_eq!((a.dtype, a.redop, a.root), (DType::F16, RedOp::Max, 1));
        assert_eq!(a.json, Some(PathBuf::from("out.json")));
        assert_eq!(coll("allreduce -a rhd").algo, Some(Algo::Rhd));
        assert_eq!(coll("allreduce --algo=tree").algo, Some(Algo::Tree));
        assert_eq!(coll("allreduce -a auto").algo, None);
        assert_eq!(coll("allreduce -e64M").sizes.max, 64 << 20);
        assert_eq!(coll("allreduce -b8").sizes.min, 8);
        assert_eq!(coll("allreduce --maxbytes=64M").sizes.max, 64 << 20);
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        assert_eq!(coll("allreduce -n 3 -n 4").iters, 4);
        assert_eq!(coll("allreduce -e 1K --maxbytes 2K").sizes.max, 2048);
    }

    #[test]
    fn collective_names_and_aliases() {
        for c in Coll::ALL {
            assert_eq!(coll(c.name()).coll, c);
        }
        assert_eq!(coll("all_reduce").coll, Coll::AllReduce);
        assert_eq!(coll("reducescatter").coll, Coll::ReduceScatter);
        assert_eq!(coll("all_gather").coll, Coll::AllGather);
        assert_eq!(coll("bcast").coll, Coll::Broadcast);
        assert!(matches!(p("p2p"), Ok(Command::P2p(_))));
    }

    #[test]
    fn every_datatype_and_op() {
        for (name, d) in [
            ("float", DType::F32),
            ("double", DType::F64),
            ("half", DType::F16),
            ("bfloat16", DType::Bf16),
            ("int32", DType::I32),
            ("int64", DType::I64),
            ("uint8", DType::U8),
        ] {
            assert_eq!(coll(&format!("allreduce -d {name}")).dtype, d);
        }
        // The aliases the library's parser has always accepted still work.
        for (name, aliases) in DTYPES {
            let d = coll(&format!("allreduce -d {name}")).dtype;
            for a in aliases {
                assert_eq!(coll(&format!("allreduce -d {a}")).dtype, d, "{a}");
            }
        }
        for d in DType::ALL {
            assert!(DTYPES.iter().any(|(n, _)| *n == d.name()), "{d:?}");
        }
        for op in RedOp::ALL {
            assert_eq!(coll(&format!("allreduce -o {}", op.name())).redop, op);
        }
        for a in Algo::ALL {
            assert_eq!(coll(&format!("allreduce -a {}", a.name())).algo, Some(a));
        }
    }

    #[test]
    fn redop_and_root_only_where_they_apply() {
        let g = coll("allgather -o max -r 3");
        assert_eq!((g.redop, g.root), (RedOp::None, 0));
        let b = coll("broadcast -o max -r 3");
        assert_eq!((b.redop, b.root), (RedOp::None, 3));
        let r = coll("reduce -o prod -r 2");
        assert_eq!((r.redop, r.root), (RedOp::Prod, 2));
        // avg on an integer type is refused only where a reduction happens.
        assert_eq!(coll("allgather -o avg -d int32").redop, RedOp::None);
        // `-a auto` is what every collective runs anyway.
        assert_eq!(coll("reduce_scatter -a auto").algo, None);
    }

    #[test]
    fn p2p_options() {
        match p("p2p -b 1 -e 4K -f 4 -n 7 -w 2 -c 0 -J p.json") {
            Ok(Command::P2p(o)) => {
                assert_eq!(
                    o.sizes,
                    Sizes {
                        min: 1,
                        max: 4096,
                        factor: 4
                    }
                );
                assert_eq!((o.iters, o.warmup, o.check), (7, 2, false));
                assert_eq!(o.json, Some(PathBuf::from("p.json")));
            }
            other => panic!("{other:?}"),
        }
        for (args, want) in [
            ("p2p -d half", "-d (--datatype) does not apply to p2p"),
            (
                "p2p --op write -T 1",
                "-T (--time) goes with gwbench's own p2p table, not with --op",
            ),
            ("p2p --op=max", "-o (--op) does not apply to p2p"),
            ("p2p -r 0", "-r (--root) does not apply to p2p"),
            ("p2p -a ring", "-a (--algo) does not apply to p2p"),
            ("p2p -a auto", "-a (--algo) does not apply to p2p"),
        ] {
            assert_eq!(usage(args), want);
        }
    }

    #[test]
    fn help_anywhere() {
        for args in [
            "--help",
            "-h",
            "allreduce -b 8 --help",
            "p2p -h",
            // Help wins over a mistake before or after it.
            "alltoall --help",
            "allreduce -b 1Q -h",
            "allreduce -J --help",
            "-b 8 allreduce -h",
        ] {
            match p(args) {
                Ok(Command::Help(text)) => assert!(
                    text.contains("Usage: gwrun -n N gwbench COLLECTIVE [OPTIONS]"),
                    "{args}: {text}"
                ),
                other => panic!("{args}: {other:?}"),
            }
        }
        for args in ["calibrate --help", "calibrate -x -h", "completions -h"] {
            match p(args) {
                Ok(Command::Help(text)) => {
                    let name = args.split(' ').next().unwrap_or_default();
                    assert!(
                        text.contains(&format!("Usage: gwbench {name}")),
                        "{args}: {text}"
                    );
                }
                other => panic!("{args}: {other:?}"),
            }
        }
        let help = Cli::command().render_long_help().to_string();
        let short_help = Cli::command().render_help().to_string();
        for (short, long) in FLAGS {
            let flag = format!("-{short}, --{long}");
            assert!(help.contains(&flag), "{flag} undocumented");
            assert!(short_help.contains(&flag), "{flag} missing from -h");
        }
        for want in [
            "allreduce",
            "(also all_reduce)",
            "reducescatter",
            "all_gather",
            "bcast",
            "p2p",
            "calibrate",
            "completions",
            "busbw    algbw x 2(n-1)/n",
            "2^10, 2^20, 2^30",
            "Exit status: 0 success; 1 wrong results",
        ] {
            assert!(help.contains(want), "--help lacks {want:?}\n{help}");
        }
    }

    #[test]
    fn calibrate_and_completions() {
        assert_eq!(p("calibrate"), Ok(Command::Calibrate));
        assert!(usage("calibrate -b 8").contains("unexpected argument '-b'"));
        assert!(usage("allreduce calibrate").contains("unexpected argument 'calibrate'"));
        assert!(usage("p2p -b 8 completions bash").contains("unexpected argument 'completions'"));
        assert_eq!(p("completions bash"), Ok(Command::Completions(Shell::Bash)));
        assert_eq!(p("completions zsh"), Ok(Command::Completions(Shell::Zsh)));
        assert_eq!(p("completions fish"), Ok(Command::Completions(Shell::Fish)));
        assert!(usage("completions tcsh").contains("invalid value 'tcsh'"));
        assert!(usage("completions").contains("<SHELL>"));
        let script = String::from_utf8(completion_script(Shell::Bash)).expect("the script is text");
        for want in ["gwbench", "--maxbytes", "reduce_scatter", "bfloat16"] {
            assert!(script.contains(want), "completion lacks {want}");
        }
    }

    #[test]
    fn mistakes_are_one_line_usage_errors() {
        let cases = [
            ("", "missing COLLECTIVE (allreduce, reduce_scatter"),
            ("alltoall", "invalid value 'alltoall' for '<COLLECTIVE>'"),
            ("-b 8 allreduce", "must be the COLLECTIVE, got option '-b'"),
            (
                "allreduce -x 1",
                "unexpected argument '-x' found; see gwbench --help",
            ),
            (
                "allreduce --maxbyte 8",
                "a similar argument exists: '--maxbytes'",
            ),
            ("allreduce --bogus 1", "unexpected argument '--bogus'"),
            (
                "allreduce -b",
                "a value is required for '--minbytes <SIZE>'",
            ),
            (
                "allreduce -b 8Q",
                "invalid value '8Q' for '--minbytes <SIZE>': expected a size",
            ),
            (
                "allreduce -e -5",
                "invalid value '-5' for '--maxbytes <SIZE>': expected a size",
            ),
            (
                "allreduce -n many",
                "'--iters <N>': expected a whole number",
            ),
            (
                "allreduce -w -1",
                "'--warmup_iters <N>': expected a whole number",
            ),
            ("allreduce -n 0", "'--iters <N>': must be at least 1"),
            (
                "allreduce -T 0",
                "'--time <SECONDS>': must be more than 0 and at most 3600 seconds",
            ),
            (
                "allreduce -T -1",
                "'--time <SECONDS>': must be more than 0 and at most 3600 seconds",
            ),
            (
                "allreduce -T inf",
                "'--time <SECONDS>': must be more than 0 and at most 3600 seconds",
            ),
            (
                "allreduce -T soon",
                "'--time <SECONDS>': expected a number of seconds",
            ),
            ("allreduce -f 1", "'--stepfactor <F>': must be at least 2"),
            (
                "allreduce -f x",
                "'--stepfactor <F>': expected a whole number",
            ),
            (
                "allreduce -b 0",
                "'--minbytes <SIZE>': must be at least 1 byte",
            ),
            ("allreduce -b 1M -e 1K", "-b 1048576 is larger than -e 1024"),
            ("allreduce -c 2", "invalid value '2' for '--check <0|1>'"),
            (
                "allreduce -d float8",
                "invalid value 'float8' for '--datatype <TYPE>'",
            ),
            (
                "allreduce -d bytes",
                "invalid value 'bytes' for '--datatype <TYPE>'",
            ),
            ("allreduce -o xor", "invalid value 'xor' for '--op <OP>'"),
            ("allreduce -r -1", "'--root <R>': expected a rank number"),
            (
                "allreduce -a butterfly",
                "invalid value 'butterfly' for '--algo <ALGO>'",
            ),
            (
                "allreduce -J=",
                "a value is required for '--output_file <FILE>'",
            ),
            ("allreduce -o avg -d int32", "-o avg needs a floating-point"),
            ("reduce -o avg -d uint8", "-o avg needs a floating-point"),
            ("reduce_scatter -a tree", "applies to allreduce only"),
            ("allreduce stray", "unexpected argument 'stray'"),
        ];
        for (args, want) in cases {
            let e = usage(args);
            assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}");
            assert!(!e.contains('\n'), "{args:?}: multi-line error {e:?}");
            assert!(!e.starts_with("error:"), "{args:?}: {e:?}");
        }
        // clap's list of choices survives the flattening.
        assert!(usage("allreduce -d float8").contains("[possible values: float, double, half"));
        assert!(usage("alltoall").contains("p2p"));
    }

    #[test]
    fn size_sequences() {
        let s = |min, max, factor| Sizes { min, max, factor }.seq();
        assert_eq!(s(8, 64, 2), [8, 16, 32, 64]);
        assert_eq!(s(8, 100, 2), [8, 16, 32, 64]);
        assert_eq!(s(8, 65536, 8), [8, 64, 512, 4096, 32768]);
        assert_eq!(s(1, 1, 2), [1]);
        assert_eq!(s(3, 2000, 10), [3, 30, 300]);
        assert_eq!(Sizes::default().seq().len(), 24);
        assert_eq!(*Sizes::default().seq().last().unwrap(), 64 << 20);
        // No overflow near the top of the address space.
        let top = s(usize::MAX / 2, usize::MAX, 2);
        assert_eq!(top, [usize::MAX / 2, usize::MAX - 1]);
    }

    #[test]
    fn busbw_factors() {
        let f = |c: Coll, n| c.busbw_factor(n);
        assert_eq!(f(Coll::AllReduce, 1), 0.0);
        assert_eq!(f(Coll::AllReduce, 2), 1.0);
        assert_eq!(f(Coll::AllReduce, 4), 1.5);
        assert_eq!(f(Coll::AllReduce, 8), 1.75);
        assert_eq!(f(Coll::ReduceScatter, 4), 0.75);
        assert_eq!(f(Coll::AllGather, 8), 0.875);
        assert_eq!(f(Coll::AllGather, 1), 0.0);
        assert_eq!(f(Coll::Broadcast, 8), 1.0);
        assert_eq!(f(Coll::Reduce, 3), 1.0);
    }
}
