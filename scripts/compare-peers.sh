#!/usr/bin/env bash
# Measures gradwire's float32 sum all-reduce against its peers on this machine
# and prints one table per configuration, then whether each performance target
# of docs/performance.md is met.
#
#   ./scripts/compare-peers.sh [--quick] [--out DIR] [--no-install]
#
#   --quick       a smoke run: one round, sizes up to 16 MiB, fewer iterations
#   --out DIR     where the raw outputs and results go
#   --no-install  use what is installed (no apt-get, no pip); missing peers are skipped
#
# Peers: OpenMPI (Debian's openmpi-bin, driven by bench/peers/mpi_allreduce.c)
# and Gloo (pygloo 0.2.1 in a CPython 3.10 virtual environment, driven by
# bench/peers/gloo_allreduce.py). Ceilings: one-thread memcpy bandwidth
# (bench/peers/memcpy_bw.c) and TCP loopback throughput one way and in both
# directions at once (iperf3). A peer or ceiling that cannot be installed is
# skipped with a line saying why; gradwire itself is always measured.
#
# Configurations: 2 ranks over TCP loopback (gradwire GW_TRANSPORT=tcp, OpenMPI
# ob1 with btl tcp,self on lo, Gloo's TCP transport), 2 ranks over shared
# memory (GW_TRANSPORT=shm, OpenMPI's shared-memory BTL), and 4 ranks (more
# than this machine's cores) for both transports. Sizes 8 B to 256 MiB.
# Every round runs, for each configuration and size, gradwire then each peer,
# one launch each (interleaved, so load drifting on a shared machine hits all
# of them alike); tables show medians over rounds, and each ratio is the median
# of the per-round ratios. Definitions are nccl-tests': GB = 1e9 bytes,
# algbw = size / time, busbw = algbw * 2(n-1)/n, time = mean per call of the
# slowest rank, out-of-place buffers.
#
# Environment (all optional):
#   ROUNDS=3            rounds (medians over them)
#   ITERS_SCALE=1       multiplies the per-size iteration counts below
#   ITERS=N, WARMUP=N   the same timed / warm-up count for every size instead
#   SIZES="8 1K ..."    sizes to run (K/M suffixes = 2^10/2^20)
#   CONFIGS="tcp2 shm2 tcp4 shm4"  (also ofi2 ofi4: GW_TRANSPORT=ofi against
#                       OpenMPI's pml cm / mtl ofi, both on libfabric's
#                       tcp;ofi_rxm provider)
#   GLOO_CONFIGS=tcp2   the TCP configurations Gloo runs in ("tcp2 tcp4": both)
#   IPERF_SECS=3        seconds per iperf3 measurement
#   RUN_TIMEOUT=600     seconds before one launch is abandoned (then n/a)
#   PEERS_VENV=DIR      the Python 3.10 venv (default $CARGO_TARGET_DIR/peers-venv)
#   CARGO_TARGET_DIR    where gradwire is built (default target)
# Output: the tables on stdout, and raw outputs, medians.csv, results.json and
# report.txt in the output directory (default $CARGO_TARGET_DIR/compare-peers),
# which scripts/plot-performance.py turns into a PNG.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

quick=0
install=1
tgt=${CARGO_TARGET_DIR:-target}
out=""
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --no-install) install=0 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --out=*) out=${1#--out=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare-peers: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $out && $out != /* ]] && out=$caller_dir/$out # --out is relative to where it was typed
out=${out:-$tgt/compare-peers}

if ((quick)); then
  : "${ROUNDS:=1}" "${ITERS_SCALE:=0.2}" "${IPERF_SECS:=1}" "${SIZES:=8 1K 64K 1M 16M}"
fi
ROUNDS=${ROUNDS:-3}
ITERS_SCALE=${ITERS_SCALE:-1}
IPERF_SECS=${IPERF_SECS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
SIZES=${SIZES:-8 1K 64K 1M 16M 64M 256M}
CONFIGS=${CONFIGS:-tcp2 shm2 tcp4 shm4}
GLOO_CONFIGS=${GLOO_CONFIGS:-tcp2}
export GW_TIMEOUT=${GW_TIMEOUT:-300}

say() { echo "compare-peers: $*" >&2; }
skip() { # skip WHAT REASON: recorded for the report, and said now
  say "SKIPPING $1: $2"
  printf 'skip\t%s\t%s\n' "$1" "$2" >>"$out/meta.tsv"
}
meta() { printf 'meta\t%s\t%s\n' "$1" "$2" >>"$out/meta.tsv"; }

bytes_of() { # 8 / 1K / 64K / 1M ... -> bytes
  local s=$1
  case $s in
    *K) echo $((${s%K} << 10)) ;;
    *M) echo $((${s%M} << 20)) ;;
    *G) echo $((${s%G} << 30)) ;;
    *) echo "$s" ;;
  esac
}

# Timed and warm-up iterations per size: enough that the fast systems time
# 0.05-0.5 s per launch (fewer left one descheduling of a rank deciding a
# 1 MiB ratio), and a few seconds at most for the slowest (Gloo, 4 ranks on
# TCP), so that three rounds take 6-8 minutes on a 2-core machine.
iters_for() { # BYTES -> "ITERS WARMUP"
  local b=$1 n w
  if ((b <= 4096)); then n=2000 w=200
  elif ((b <= 65536)); then n=500 w=50
  elif ((b <= 1 << 20)); then n=200 w=20
  elif ((b <= 16 << 20)); then n=20 w=2
  elif ((b <= 64 << 20)); then n=6 w=1
  else n=3 w=1
  fi
  n=$(awk -v n="$n" -v s="$ITERS_SCALE" 'BEGIN { x = int(n * s + 0.5); print (x < 1 ? 1 : x) }')
  w=$(awk -v n="$w" -v s="$ITERS_SCALE" 'BEGIN { x = int(n * s + 0.5); print (x < 1 ? 1 : x) }')
  echo "${ITERS:-$n} ${WARMUP:-$w}"
}

as_root() {
  if ((EUID == 0)); then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else return 1
  fi
}

# Background processes of ours (iperf3 servers, Gloo ranks) end with the script.
trap 'pids=$(jobs -p); [[ -z $pids ]] || kill $pids 2>/dev/null || true' EXIT
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/raw" "$out/meta.tsv" "$out/runs.tsv"
mkdir -p "$out/raw" "$out/bin"
: >"$out/runs.tsv"
: >"$out/meta.tsv"
meta started "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
meta commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
meta cpus "$(nproc)"
meta kernel "$(uname -r)"
meta rounds "$ROUNDS"
meta quick "$quick"

# ---- installing --------------------------------------------------------------
if ((install)); then
  need=()
  command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
  command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
  command -v cc >/dev/null 2>&1 || need+=(gcc)
  if ((${#need[@]})); then
    say "installing from Debian: ${need[*]}"
    if ! { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } >"$out/apt.log" 2>&1; then
      say "apt-get failed (see $out/apt.log); going on with what is installed"
    fi
  fi
fi

say "building gradwire (release: gwrun, gwbench)"
cargo build --release -p gw-jobserver -p gw-bench
gwrun=$tgt/release/gwrun
gwbench=$tgt/release/gwbench
[[ -x $gwrun && -x $gwbench ]] || { say "cannot find $gwrun and $gwbench after the build"; exit 1; }

have_cc=0
if command -v cc >/dev/null 2>&1; then
  have_cc=1
  cc -O2 -o "$out/bin/memcpy_bw" bench/peers/memcpy_bw.c
  cc -O2 -o "$out/bin/maxrss" bench/peers/maxrss.c
else
  skip memcpy "no C compiler (cc); install gcc"
  skip memory "no C compiler (cc) for bench/peers/maxrss.c; install gcc"
fi

have_mpi=0
mpirun_flags=()
mpi_shm_btl=""
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
  skip openmpi "mpicc/mpirun not found: install Debian's openmpi-bin and libopenmpi-dev"
elif ! mpicc -O2 -o "$out/bin/mpi_allreduce" bench/peers/mpi_allreduce.c 2>"$out/mpicc.log"; then
  skip openmpi "mpicc failed on bench/peers/mpi_allreduce.c (see $out/mpicc.log)"
else
  have_mpi=1
  ((EUID == 0)) && mpirun_flags+=(--allow-run-as-root)
  # Open MPI 4 calls its shared-memory BTL vader, Open MPI 5 sm.
  if ompi_info 2>/dev/null | grep -q 'MCA btl: vader'; then mpi_shm_btl=vader; else mpi_shm_btl=sm; fi
  meta openmpi "$(mpirun --version 2>/dev/null | head -n1)"
fi

have_gloo=0
venv=${PEERS_VENV:-$tgt/peers-venv}
py310=""
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
  py310=$venv/bin/python
else
  # pygloo 0.2.1 has wheels for CPython <= 3.10 only: find a 3.10 interpreter.
  if command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.10(\.[0-9]+)?$' | sort -V | tail -n1 || true)
    [[ -n $v && -x $(pyenv root)/versions/$v/bin/python3.10 ]] && py310=$(pyenv root)/versions/$v/bin/python3.10
  fi
  [[ -z $py310 ]] && command -v python3.10 >/dev/null 2>&1 && py310=$(command -v python3.10)
  if [[ -z $py310 ]]; then
    skip gloo "no CPython 3.10 found (pyenv versions, python3.10), which pygloo 0.2.1's wheels need"
  elif ! "$py310" -m venv --clear "$venv" >"$out/venv.log" 2>&1; then
    skip gloo "cannot make a virtual environment with $py310 (see $out/venv.log)"
    py310=""
  else
    py310=$venv/bin/python
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if [[ -n $py310 ]]; then
  if ((install)) && ! "$py310" -c 'import pygloo, numpy' 2>/dev/null; then
    say "installing pygloo==0.2.1 and numpy into $venv"
    "$py310" -m pip install -q pygloo==0.2.1 numpy >"$out/pip.log" 2>&1 || true
  fi
  if "$py310" -c 'import pygloo, numpy' 2>>"$out/pip.log"; then
    have_gloo=1
    meta gloo "pygloo $("$py310" -m pip show pygloo 2>/dev/null | awk '/^Version:/ { print $2 }'), $("$py310" --version 2>&1)"
  elif ((install)); then
    skip gloo "pygloo==0.2.1 or numpy did not install into $venv (see $out/pip.log)"
  else
    skip gloo "pygloo or numpy is not installed in $venv (and --no-install)"
  fi
fi

have_iperf=0
if command -v iperf3 >/dev/null 2>&1; then
  have_iperf=1
  meta iperf3 "$(iperf3 --version 2>/dev/null | head -n1)"
else
  skip tcp-ceiling "iperf3 not found: install Debian's iperf3"
fi

# ---- running -----------------------------------------------------------------
# Each launch writes OUT/raw/NAME.{out,json} and one line to runs.tsv:
#   KIND CONFIG SYSTEM ROUND BYTES FILE STATUS
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$out/runs.tsv"; }

launch() { # NAME CMD...: runs CMD with a deadline, output to raw/NAME.out; prints the status
  local name=$1 rc=0
  shift
  timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >"$out/raw/$name.out" 2>&1 </dev/null || rc=$?
  ((rc == 124)) && say "$name: no result within RUN_TIMEOUT=${RUN_TIMEOUT}s"
  ((rc != 0 && rc != 124)) && say "$name: exit status $rc (last lines of $out/raw/$name.out follow)" && tail -n 5 "$out/raw/$name.out" >&2
  echo "$rc"
}

cfg_ranks() { echo "${1: -1}"; }
cfg_transport() { echo "${1%[0-9]}"; }

run_gradwire() { # CONFIG ROUND BYTES ITERS WARMUP
  local c=$1 r=$2 b=$3 n=$4 w=$5 name rc
  name=$c.gradwire.r$r.$b
  rc=$(GW_TRANSPORT=$(cfg_transport "$c") GW_OFI_PROVIDER="tcp;ofi_rxm" launch "$name" "$gwrun" -n "$(cfg_ranks "$c")" "$gwbench" allreduce \
    -b "$b" -e "$b" -f 2 -n "$n" -w "$w" -c 0 -d float -o sum -J "$out/raw/$name.json")
  record coll "$c" gradwire "$r" "$b" "raw/$name.json" "$rc"
}

mpi_flags() { # CONFIG -> mpirun flags
  local c=$1
  local f=("${mpirun_flags[@]}")
  (($(cfg_ranks "$c") > $(nproc))) && f+=(--oversubscribe)
  if [[ $(cfg_transport "$c") == tcp ]]; then
    f+=(--mca pml ob1 --mca btl "tcp,self" --mca btl_tcp_if_include lo)
  elif [[ $(cfg_transport "$c") == ofi ]]; then
    f+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "tcp;ofi_rxm")
  else
    f+=(--mca pml ob1 --mca btl "self,$mpi_shm_btl")
  fi
  echo "${f[*]}"
}

run_mpi() { # CONFIG ROUND BYTES ITERS WARMUP
  local c=$1 r=$2 b=$3 n=$4 w=$5 name rc flags
  name=$c.openmpi.r$r.$b
  read -r -a flags <<<"$(mpi_flags "$c")"
  rc=$(launch "$name" mpirun "${flags[@]}" -n "$(cfg_ranks "$c")" "$out/bin/mpi_allreduce" "$b:$n:$w")
  record coll "$c" openmpi "$r" "$b" "raw/$name.out" "$rc"
}

run_gloo() { # CONFIG ROUND BYTES ITERS WARMUP
  local c=$1 r=$2 b=$3 n=$4 w=$5 name rc=0 k store pids=() st
  local ranks
  ranks=$(cfg_ranks "$c")
  name=$c.gloo.r$r.$b
  store=$(mktemp -d "${TMPDIR:-/tmp}/gloo-store.XXXXXX")
  : >"$out/raw/$name.out"
  for ((k = 0; k < ranks; k++)); do
    RANK=$k WORLD_SIZE=$ranks STORE_DIR=$store timeout --kill-after=10 "$RUN_TIMEOUT" \
      "$py310" bench/peers/gloo_allreduce.py "$b:$n:$w" >>"$out/raw/$name.out" 2>&1 </dev/null &
    pids+=($!)
  done
  for k in "${pids[@]}"; do
    st=0
    wait "$k" || st=$?
    ((st != 0 && rc == 0)) && rc=$st
  done
  rm -rf "$store"
  ((rc != 0)) && say "$name: exit status $rc (last lines of $out/raw/$name.out follow)" && tail -n 5 "$out/raw/$name.out" >&2
  record coll "$c" gloo "$r" "$b" "raw/$name.out" "$rc"
}

iperf_port=${IPERF_PORT:-5299}
run_iperf() { # ROUND one|bidir PAIRS: PAIRS client/server pairs at once, each one way or both ways
  local r=$1 mode=$2 pairs=$3 name k t rc
  local extra=() spids=() cpids=()
  name=ceiling.tcp-$mode-x$pairs.r$r
  [[ $mode == bidir ]] && extra=(--bidir)
  for ((k = 0; k < pairs; k++)); do
    iperf3 -s -1 -B 127.0.0.1 -p $((iperf_port + k)) --forceflush >"$out/raw/$name.$k.server" 2>&1 </dev/null &
    spids+=($!)
  done
  for ((k = 0; k < pairs; k++)); do # until every server listens
    for ((t = 0; t < 100; t++)); do
      grep -q 'Server listening' "$out/raw/$name.$k.server" 2>/dev/null && break
      sleep 0.05
    done
  done
  for ((k = 0; k < pairs; k++)); do
    timeout $((IPERF_SECS + 30)) iperf3 -c 127.0.0.1 -p $((iperf_port + k)) -t "$IPERF_SECS" -O 1 -J "${extra[@]}" \
      >"$out/raw/$name.$k.json" 2>&1 </dev/null &
    cpids+=($!)
  done
  for ((k = 0; k < pairs; k++)); do
    rc=0
    wait "${cpids[k]}" || rc=$?
    if ((rc != 0)); then
      say "$name: iperf3 client $k failed (see $out/raw/$name.$k.json)"
      kill "${spids[k]}" 2>/dev/null || true # a one-off server that got no client
    fi
    wait "${spids[k]}" 2>/dev/null || true
    # The report adds the pairs of one round: ceiling tcp-MODE-PROCESSES.
    record ceiling "tcp-$mode-$((2 * pairs))" iperf3 "$r" 0 "raw/$name.$k.json" "$rc"
  done
}

run_memcpy() { # ROUND
  local r=$1 name=ceiling.memcpy.r$1 rc
  rc=$(launch "$name" "$out/bin/memcpy_bw" 256 9)
  record ceiling memcpy memcpy "$r" 0 "raw/$name.out" "$rc"
}

sizes=()
for s in $SIZES; do sizes+=("$(bytes_of "$s")"); done
start=$SECONDS
for ((r = 1; r <= ROUNDS; r++)); do
  say "round $r of $ROUNDS: ceilings ($((SECONDS - start)) s so far)"
  ((have_cc)) && run_memcpy "$r"
  if ((have_iperf)); then
    run_iperf "$r" one 1
    run_iperf "$r" bidir 1
    # As many processes as the 4-rank configurations have.
    [[ " $CONFIGS " == *4\ * ]] && run_iperf "$r" bidir 2
  fi
  for c in $CONFIGS; do
    case $c in tcp2 | shm2 | tcp4 | shm4 | ofi2 | ofi4) ;; *) say "unknown configuration '$c' in CONFIGS (tcp2 shm2 tcp4 shm4 ofi2 ofi4)"; exit 2 ;; esac
    say "round $r of $ROUNDS: $c ($((SECONDS - start)) s so far)"
    for b in "${sizes[@]}"; do
      read -r n w <<<"$(iters_for "$b")"
      run_gradwire "$c" "$r" "$b" "$n" "$w"
      ((have_mpi)) && run_mpi "$c" "$r" "$b" "$n" "$w"
      [[ $(cfg_transport "$c") == tcp && " $GLOO_CONFIGS " == *" $c "* ]] && ((have_gloo)) && run_gloo "$c" "$r" "$b" "$n" "$w"
    done
  done
done

# ---- memory: peak RSS of a 2-rank 256 MiB all-reduce, per rank -------------------
if ((have_cc)); then
  mem_bytes=$((256 << 20))
  say "memory: peak RSS of 2-rank 256 MiB all-reduces ($((SECONDS - start)) s so far)"
  for t in tcp shm; do
    # The program and the communicator alone, for comparison: an 8-byte all-reduce.
    name=mem.$t.gradwire.8
    rc=$(GW_TRANSPORT=$t launch "$name" "$gwrun" -n 2 "$out/bin/maxrss" "$gwbench" allreduce -b 8 -e 8 -n 2 -w 1 -c 0)
    record memory "${t}2" gradwire 0 8 "raw/$name.out" "$rc"
    name=mem.$t.gradwire
    rc=$(GW_TRANSPORT=$t launch "$name" "$gwrun" -n 2 "$out/bin/maxrss" "$gwbench" allreduce \
      -b "$mem_bytes" -e "$mem_bytes" -n 2 -w 1 -c 0)
    record memory "${t}2" gradwire 0 "$mem_bytes" "raw/$name.out" "$rc"
    if ((have_mpi)); then
      name=mem.$t.openmpi
      read -r -a flags <<<"$(mpi_flags "${t}2")"
      rc=$(launch "$name" mpirun "${flags[@]}" -n 2 "$out/bin/maxrss" "$out/bin/mpi_allreduce" "$mem_bytes:2:1")
      record memory "${t}2" openmpi 0 "$mem_bytes" "raw/$name.out" "$rc"
    fi
  done
fi

meta seconds "$((SECONDS - start))"
if ((have_mpi)); then
  for c in $CONFIGS; do meta "mpi_flags_$c" "$(mpi_flags "$c")"; done
fi
say "done in $((SECONDS - start)) s; report follows (also in $out/report.txt)"
echo
python3 bench/peers/report.py "$out" | tee "$out/report.txt"
echo
echo "raw outputs, medians.csv and results.json: $out"

# The plot: matplotlib from the default python3, else installed into the venv.
plot_py=""
if python3 -c 'import matplotlib' 2>/dev/null; then
  plot_py=python3
elif [[ -n $py310 ]]; then
  ((install)) && ! "$py310" -c 'import matplotlib' 2>/dev/null && say "installing matplotlib into $venv for the plot" &&
    { "$py310" -m pip install -q matplotlib >>"$out/pip.log" 2>&1 || true; }
  "$py310" -c 'import matplotlib' 2>/dev/null && plot_py=$py310
fi
if [[ -n $plot_py ]]; then
  "$plot_py" scripts/plot-performance.py "$out" || say "the plot failed"
else
  say "no matplotlib (pip install matplotlib), so no plot: python3 scripts/plot-performance.py $out makes it later"
fi
