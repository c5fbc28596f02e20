//! gwbench's command line, parsed by hand.
//!
//! The flags are nccl-tests' (`-b -e -f -n -w -c -d -o -r -J`, with their long
//! spellings), plus `-a` for the all-reduce algorithm. Short options take their
//! value as the next word or glued on (`-b8`, `-e64M`); long ones as the next
//! word or after `=` (`--maxbytes=64M`). Every mistake is a [`UsageError`]
//! whose text completes `gwbench: error: `.

use gw_collectives::{Algo, DType, OpKind, RedOp};
use std::fmt;
use std::path::PathBuf;

/// The text of `gwbench --help`.
pub const HELP: &str = "\
gwbench - gradwire microbenchmarks in the style of nccl-tests

usage: gwrun -n N gwbench COLLECTIVE [OPTIONS]
       gwrun -n 2 gwbench p2p [OPTIONS]
       gwrun -n 2 gwbench calibrate   measure the cost model's α and β over
                                      tcp and shm and γ of the reduction, and
                                      write them where rank 0 of every later
                                      job reads them (GW_MODEL_FILE, else
                                      ~/.cache/gradwire/model)

collectives (each run out-of-place, then in-place, for every size):
  allreduce        (also all_reduce)
  reduce_scatter   (also reducescatter)
  allgather        (also all_gather)
  broadcast        (also bcast)
  reduce
  p2p              point-to-point on exactly 2 ranks: ping-pong latency (half
                   the round trip), one-way bandwidth, and bidirectional
                   bandwidth with sendrecv

options (nccl-tests' flags; sizes take K, M or G suffixes = 2^10, 2^20, 2^30):
  -b, --minbytes SIZE      smallest size (default 8)
  -e, --maxbytes SIZE      largest size (default 64M)
  -f, --stepfactor F       multiply the size by F between rows (default 2, >= 2)
  -n, --iters N            timed iterations per size and placement (default 20)
  -w, --warmup_iters N     untimed iterations before them (default 5)
  -c, --check 0|1          check the result of one extra iteration per size and
                           placement, outside the timed region (default 1)
  -d, --datatype TYPE      float, double, half, bfloat16, int32, int64, uint8
                           (default float; not for p2p)
  -o, --op OP              sum, prod, min, max, avg (default sum; avg needs a
                           floating-point type; allreduce, reduce_scatter and
                           reduce only)
  -r, --root R             root rank of broadcast and reduce (default 0)
  -a, --algo ALGO          all-reduce algorithm: ring, tree, rhd, rd, hier or auto
                           (default auto: the library's choice per size, which
                           GW_ALGO and GW_TREE_THRESHOLD steer)
  -J, --output_file FILE   also write the results as JSON to FILE (rank 0)
  -h, --help               print this help and exit

output (rank 0 only; the nccl-tests table):
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

p2p table: size, latency (us, half round trip), one-way bandwidth and
bidirectional bandwidth (GB/s, both directions summed), #wrong bytes.

exit status: 0 success; 1 wrong results or a library error (one line naming
it); 2 usage error.
";

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

    pub fn parse(s: &str) -> Option<Coll> {
        Some(match s {
            "allreduce" | "all_reduce" => Coll::AllReduce,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "allgather" | "all_gather" => Coll::AllGather,
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            _ => return None,
        })
    }

    /// The name gwbench prints (and accepts first).
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
    pub warmup: usize,
    pub check: bool,
    pub dtype: DType,
    pub redop: RedOp,
    pub root: u32,
    /// `None` is `-a auto`.
    pub algo: Option<Algo>,
    pub json: Option<PathBuf>,
}

/// Options of the point-to-point benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct P2pOpts {
    pub sizes: Sizes,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub json: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Help,
    Coll(CollOpts),
    P2p(P2pOpts),
    Calibrate,
}

/// A command-line mistake; the text completes `gwbench: error: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Parses a size: digits with an optional K, M or G (either case), powers of 1024.
pub fn parse_size(s: &str) -> Option<usize> {
    let (digits, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1usize << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<usize>().ok()?.checked_mul(mult)
}

/// The flags: short letter, long name, whether p2p accepts it.
const FLAGS: &[(char, &str, bool)] = &[
    ('b', "minbytes", true),
    ('e', "maxbytes", true),
    ('f', "stepfactor", true),
    ('n', "iters", true),
    ('w', "warmup_iters", true),
    ('c', "check", true),
    ('d', "datatype", false),
    ('o', "op", false),
    ('r', "root", false),
    ('a', "algo", false),
    ('J', "output_file", true),
];

fn whole(flag: char, v: &str) -> Result<usize, UsageError> {
    match v.parse::<usize>() {
        Ok(n) => Ok(n),
        Err(_) => err(format!("-{flag} expects a whole number, got '{v}'")),
    }
}

/// Parses gwbench's arguments (without `argv[0]`).
pub fn parse(args: &[String]) -> Result<Command, UsageError> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Command::Help);
    }
    let Some(first) = args.first() else {
        return err(
            "missing COLLECTIVE (allreduce, reduce_scatter, allgather, broadcast, reduce or p2p); see gwbench --help",
        );
    };
    if first == "calibrate" {
        if args.len() > 1 {
            return err(format!("calibrate takes no options, got '{}'", args[1]));
        }
        return Ok(Command::Calibrate);
    }
    let coll = match first.as_str() {
        "p2p" => None,
        name => match Coll::parse(name) {
            Some(c) => Some(c),
            None if name.starts_with('-') => {
                return err(format!(
                    "the first argument must be the COLLECTIVE, got option '{name}'; see gwbench --help"
                ));
            }
            None => {
                return err(format!(
                    "unknown collective '{name}' (allreduce, reduce_scatter, allgather, broadcast, reduce or p2p)"
                ));
            }
        },
    };

    let mut sizes = Sizes::default();
    let mut iters = 20usize;
    let mut warmup = 5usize;
    let mut check = true;
    let mut dtype = DType::F32;
    let mut redop = RedOp::Sum;
    let mut root = 0u32;
    let mut algo = None;
    let mut json = None;

    let mut it = args[1..].iter();
    while let Some(arg) = it.next() {
        // Find the flag and any value glued to it.
        let (short, inline): (char, Option<&str>) = if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            match FLAGS.iter().find(|f| f.1 == name) {
                Some(f) => (f.0, value),
                None => return err(format!("unknown option '--{name}'; see gwbench --help")),
            }
        } else if let Some(rest) = arg.strip_prefix('-') {
            let mut chars = rest.chars();
            let Some(c) = chars.next() else {
                return err(format!("unexpected argument '{arg}'"));
            };
            if !FLAGS.iter().any(|f| f.0 == c) {
                return err(format!("unknown option '-{c}'; see gwbench --help"));
            }
            let glued = chars.as_str();
            (c, (!glued.is_empty()).then_some(glued))
        } else {
            return err(format!(
                "unexpected argument '{arg}' (options come after the COLLECTIVE)"
            ));
        };
        let flag = FLAGS
            .iter()
            .find(|f| f.0 == short)
            .copied()
            .unwrap_or((short, "", true));
        if coll.is_none() && !flag.2 {
            return err(format!("-{short} (--{}) does not apply to p2p", flag.1));
        }
        let value = match inline {
            Some(v) => v,
            None => match it.next() {
                Some(v) => v.as_str(),
                None => return err(format!("-{short} (--{}) needs a value", flag.1)),
            },
        };
        match short {
            'b' | 'e' => {
                let Some(s) = parse_size(value) else {
                    return err(format!(
                        "-{short} expects a size such as 8, 128K, 64M or 1G, got '{value}'"
                    ));
                };
                if short == 'b' {
                    sizes.min = s;
                } else {
                    sizes.max = s;
                }
            }
            'f' => sizes.factor = whole('f', value)?,
            'n' => iters = whole('n', value)?,
            'w' => warmup = whole('w', value)?,
            'c' => {
                check = match value {
                    "0" => false,
                    "1" => true,
                    _ => return err(format!("-c expects 0 or 1, got '{value}'")),
                }
            }
            'd' => {
                dtype = match DType::parse(value) {
                    Some(d) if d != DType::Bytes => d,
                    _ => {
                        return err(format!(
                            "unknown datatype '{value}' (float, double, half, bfloat16, int32, int64, uint8)"
                        ));
                    }
                }
            }
            'o' => {
                redop = match RedOp::parse(value) {
                    Some(o) => o,
                    None => return err(format!("unknown op '{value}' (sum, prod, min, max, avg)")),
                }
            }
            'r' => {
                root = match value.parse::<u32>() {
                    Ok(r) => r,
                    Err(_) => return err(format!("-r expects a rank number, got '{value}'")),
                }
            }
            'a' => {
                algo = match value {
                    "auto" => None,
                    v => match Algo::parse(v) {
                        Some(a) => Some(a),
                        None => {
                            return err(format!(
                                "unknown algorithm '{v}' (ring, tree, rhd, rd, hier, auto)"
                            ));
                        }
                    },
                }
            }
            'J' => {
                if value.is_empty() {
                    return err("-J needs a file name");
                }
                json = Some(PathBuf::from(value));
            }
            _ => unreachable!("every flag in FLAGS is handled"),
        }
    }

    if sizes.min == 0 {
        return err("-b must be at least 1 byte");
    }
    if sizes.min > sizes.max {
        return err(format!("-b {} is larger than -e {}", sizes.min, sizes.max));
    }
    if sizes.factor < 2 {
        return err(format!("-f must be at least 2, got {}", sizes.factor));
    }
    if iters == 0 {
        return err("-n must be at least 1");
    }

    let Some(coll) = coll else {
        return Ok(Command::P2p(P2pOpts {
            sizes,
            iters,
            warmup,
            check,
            json,
        }));
    };
    if coll.reduces() && redop == RedOp::Avg && !dtype.is_float() {
        return err(format!(
            "-o avg needs a floating-point datatype, not {} (the library refuses integer averages)",
            dtype.name()
        ));
    }
    if let Some(a) = algo
        && coll != Coll::AllReduce
    {
        return err(format!(
            "-a {} applies to allreduce only; {} has a single algorithm (use -a auto)",
            a.name(),
            coll.name()
        ));
    }
    Ok(Command::Coll(CollOpts {
        coll,
        sizes,
        iters,
        warmup,
        check,
        dtype,
        redop: if coll.reduces() { redop } else { RedOp::None },
        root: if coll.rooted() { root } else { 0 },
        algo,
        json,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, UsageError> {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        parse(&v)
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

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("128k"), Some(128 << 10));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        for bad in [
            "",
            "K",
            "1.5M",
            "-1",
            "1T",
            "1KB",
            " 8",
            "99999999999999999999",
        ] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
        assert_eq!(parse_size(&format!("{}G", usize::MAX)), None);
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
        assert_eq!((a.dtype, a.redop, a.root), (DType::F16, RedOp::Max, 1));
        assert_eq!(a.json, Some(PathBuf::from("out.json")));
        assert_eq!(coll("allreduce -a rhd").algo, Some(Algo::Rhd));
        assert_eq!(coll("allreduce --algo=tree").algo, Some(Algo::Tree));
        assert_eq!(coll("allreduce -a auto").algo, None);
    }

    #[test]
    fn collective_names_and_aliases() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
        }
        assert_eq!(coll("all_reduce").coll, Coll::AllReduce);
        assert_eq!(coll("reducescatter").coll, Coll::ReduceScatter);
        assert_eq!(coll("all_gather").coll, Coll::AllGather);
        assert_eq!(coll("bcast").coll, Coll::Broadcast);
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
        for op in RedOp::ALL {
            assert_eq!(coll(&format!("allreduce -o {}", op.name())).redop, op);
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
        assert!(usage("p2p -d half").contains("does not apply to p2p"));
        assert!(usage("p2p -a ring").contains("does not apply to p2p"));
    }

    #[test]
    fn help_anywhere() {
        assert_eq!(p("--help"), Ok(Command::Help));
        assert_eq!(p("-h"), Ok(Command::Help));
        assert_eq!(p("allreduce -b 8 --help"), Ok(Command::Help));
        for flag in FLAGS {
            assert!(
                HELP.contains(&format!("-{}, --{}", flag.0, flag.1)),
                "{flag:?} undocumented"
            );
        }
    }

    #[test]
    fn mistakes_are_one_line_usage_errors() {
        let cases = [
            ("", "missing COLLECTIVE"),
            ("alltoall", "unknown collective 'alltoall'"),
            ("-b 8 allreduce", "must be the COLLECTIVE"),
            ("allreduce -x 1", "unknown option '-x'"),
            ("allreduce --bogus 1", "unknown option '--bogus'"),
            ("allreduce -b", "-b (--minbytes) needs a value"),
            ("allreduce -b 8Q", "-b expects a size"),
            ("allreduce -e -5", "-e expects a size"),
            ("allreduce -n many", "-n expects a whole number"),
            ("allreduce -n 0", "-n must be at least 1"),
            ("allreduce -f 1", "-f must be at least 2"),
            ("allreduce -b 0", "-b must be at least 1"),
            ("allreduce -b 1M -e 1K", "larger than -e"),
            ("allreduce -c 2", "-c expects 0 or 1"),
            ("allreduce -d float8", "unknown datatype 'float8'"),
            ("allreduce -d bytes", "unknown datatype 'bytes'"),
            ("allreduce -o xor", "unknown op 'xor'"),
            ("allreduce -r -1", "-r expects a rank"),
            ("allreduce -a butterfly", "unknown algorithm 'butterfly'"),
            ("allreduce -o avg -d int32", "-o avg needs a floating-point"),
            ("reduce -o avg -d uint8", "-o avg needs a floating-point"),
            ("reduce_scatter -a tree", "applies to allreduce only"),
            ("allreduce stray", "unexpected argument 'stray'"),
        ];
        for (args, want) in cases {
            let e = usage(args);
            assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}");
            assert!(!e.contains('\n'), "{args:?}: multi-line error {e:?}");
        }
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
