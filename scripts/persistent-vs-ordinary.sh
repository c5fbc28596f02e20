#!/usr/bin/env bash
# Persistent all-reduce against the ordinary call, in the same run.
#
# Each round runs gwbench allreduce five times: ordinary (-P 0), persistent
# through the host region (-P 1; shm only, see collectives/src/host_rounds.rs),
# persistent two-sided on the engine (-P 1, GW_ONE_SIDED=0,
# GW_HOST_ROUND_BYTES=0), persistent one-sided (-P 1, GW_ONE_SIDED=1) and
# persistent on buffers the request allocates in a region every rank of the
# host maps (-P 1 --shared 1, collectives/src/shared_all_reduce.rs; over tcp
# it runs on the engine with private buffers), in that order in odd rounds
# and the reverse in even ones, so that the machine's speed of the moment
# is shared; the verdict per size is the
# median over rounds of ordinary/persistent (above 1: persistent faster),
# with every round's ratio. Times are gwbench's out-of-place column.
#
#   scripts/persistent-vs-ordinary.sh [-t shm|tcp|ofi] [-p RANKS] [-r ROUNDS]
#                                     [-b MIN] [-e MAX] [-n ITERS | -T SECONDS]
#   (defaults: shm, 2 ranks, 3 rounds, 1K to 4M, 200 iterations; -T sizes
#   each loop by time instead, as gwbench -T does)
set -euo pipefail
cd "$(dirname "$0")/.."
t=shm np=2 rounds=3 min=1K max=4M count=(-n 200)
while getopts "t:p:r:b:e:n:T:h" o; do
  case $o in
  t) t=$OPTARG ;; p) np=$OPTARG ;; r) rounds=$OPTARG ;;
  b) min=$OPTARG ;; e) max=$OPTARG ;; n) count=(-n "$OPTARG") ;;
  T) count=(-T "$OPTARG") ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
cargo build --release -q -p gw-bench -p gw-launch
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# Odd rounds run ordinary first, even rounds last: on this VM whichever
# program runs second in a round came out up to 2.5x faster even where both
# ran the same schedule, so a fixed order would bias every ratio.
for r in $(seq 1 "$rounds"); do
  order="ord host two one shared"
  ((r % 2)) || order="shared one two host ord"
  for m in $order; do
    # The shared mode keeps GW_HOST_ROUND_BYTES unset: setting it would
    # also lift its default of private buffers for small calls where ranks
    # outnumber cores.
    H=(GW_HOST_ROUND_BYTES=$((1 << 30))) S=0
    case $m in
    ord) P=0 OS=auto ;; host) P=1 OS=auto ;; two) P=1 OS=0 H=(GW_HOST_ROUND_BYTES=0) ;;
    one) P=1 OS=1 ;; shared) P=1 OS=auto S=1 H=() ;;
    esac
    env "${H[@]}" GW_ONE_SIDED=$OS GW_TRANSPORT=$t \
      target/release/gwrun -n "$np" target/release/gwbench \
      allreduce -b "$min" -e "$max" -f 4 "${count[@]}" -w 20 -c 0 -P $P --shared $S 2>/dev/null |
      awk -v r="$r" -v m="$m" '/^\[0\] +[0-9]/ {print r, m, $2, $7}'
  done
done >"$rows"
python3 - "$rows" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(lambda: collections.defaultdict(dict))
for line in open(sys.argv[1]):
    r, m, size, us = line.split()
    d[int(size)][m][int(r)] = float(us)
modes = ["host", "two", "one", "shared"]
print("times: median us over rounds; ord/X: median of per-round ordinary/X [min-max]")
print(f"{'bytes':>9} {'ord us':>9}" + "".join(f" {m + ' us':>9}" for m in modes)
      + "".join(f" {'ord/' + m:>18}" for m in modes))
for size in sorted(d):
    x = d[size]
    med = lambda m: statistics.median(x[m].values()) if x[m] else float("nan")
    def ratio(m):
        rs = [x["ord"][r] / x[m][r] for r in x[m] if r in x["ord"]]
        if not rs:
            return "-"
        return f"{statistics.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]"
    print(f"{size:>9} {med('ord'):>9.2f}" + "".join(f" {med(m):>9.2f}" for m in modes)
          + "".join(f" {ratio(m):>18}" for m in modes))
PY
