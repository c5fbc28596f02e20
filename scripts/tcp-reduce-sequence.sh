#!/usr/bin/env bash
# The 2-rank TCP reduce inside the launch sequence that made it slow.
#
# Alone, `gwbench reduce` over TCP was never slow; inside
# compare-collectives.py's sequence (each collective's gwbench launch
# followed by OpenMPI's, then both p2p programs, round after round) it ran
# 4-10x slower in most rounds until its large one-way segments asked the
# kernel for immediate ACKs (docs/performance.md, "The TCP reduce and
# delayed ACKs"). This replays that sequence and prints the reduce's 1 and
# 16 MiB times (µs, out of place / in place) per round, so that a build
# can be checked for it: BIN names the directory of gwrun and gwbench.
#
#   scripts/tcp-reduce-sequence.sh [ROUNDS]     (default 4; BIN: this checkout's
#                                               release build, built first)
#
# Needs OpenMPI (mpicc.openmpi, mpirun.openmpi).
set -euo pipefail
[[ -z ${BIN:-} ]] || BIN=$(cd "$BIN" && pwd)
cd "$(dirname "$0")/.."
rounds=${1:-4}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release}
[[ -n ${BIN:-} ]] || cargo build --release -q -p gw-bench -p gw-launch
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpicc.openmpi -O2 -o "$out/mpi_coll" bench/peers/mpi_coll.c -lm
mpicc.openmpi -O2 -o "$out/mpi_p2p" bench/peers/mpi_p2p.c -lm
mpi=(mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include lo -n 2)
sizes=(65536:1:5 1048576:1:5 16777216:1:5)
# One launch, its output in $out/NAME.log; on failure the log is shown.
launch() {
  local name=$1
  shift
  "$@" >"$out/$name.log" 2>&1 || {
    echo "tcp-reduce-sequence.sh: $name failed:" >&2
    cat "$out/$name.log" >&2
    exit 1
  }
}
gw() { GW_TRANSPORT=tcp "$bin/gwrun" -n 2 "$bin/gwbench" "$@" -b 64K -e 16M -f 16 -n 1 -w 5 -T 0.2 -c 1; }
for r in $(seq 1 "$rounds"); do
  for c in allreduce reduce_scatter allgather broadcast reduce; do
    launch "$c" gw "$c"
    if [[ $c == reduce ]]; then
      awk -v r="$r" '/^\[0\] +(1048576|16777216) / {printf "round %s, %s B: %s / %s us\n", r, $2, $7, $11}' "$out/$c.log"
    fi
    launch "openmpi-$c" "${mpi[@]}" "$out/mpi_coll" "$c" -T 0.2 "${sizes[@]}"
  done
  launch p2p gw p2p
  launch openmpi-p2p "${mpi[@]}" "$out/mpi_p2p" -T 0.2 "${sizes[@]}"
done
