#!/usr/bin/env bash
# Persistent all-reduce against the ordinary call, in the same run.
#
# Each round runs gwbench allreduce three times: ordinary (-P 0), persistent
# two-sided (-P 1, GW_ONE_SIDED=0) and persistent one-sided (-P 1,
# GW_ONE_SIDED=1), in that order in odd rounds and the reverse in even ones,
# so that the machine's speed of the moment is shared;
# the verdict per size is the median over rounds of ordinary/persistent
# (above 1: persistent faster). Times are gwbench's out-of-place column.
#
#   scripts/persistent-vs-ordinary.sh [-t shm|tcp|ofi] [-p RANKS] [-r ROUNDS]
#                                     [-b MIN] [-e MAX] [-n ITERS]
#   (defaults: shm, 2 ranks, 3 rounds, 1K to 4M, 200 iterations)
set -euo pipefail
cd "$(dirname "$0")/.."
t=shm np=2 rounds=3 min=1K max=4M iters=200
while getopts "t:p:r:b:e:n:h" o; do
  case $o in
  t) t=$OPTARG ;; p) np=$OPTARG ;; r) rounds=$OPTARG ;;
  b) min=$OPTARG ;; e) max=$OPTARG ;; n) iters=$OPTARG ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
cargo build --release -q -p gw-bench -p gw-launch
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# Odd rounds run ordinary first, even rounds last: on this VM whichever
# program runs second in a round came out up to 2.5x faster even where both
# ran the same schedule, so a fixed order would bias every ratio.
for r in $(seq 1 "$rounds"); do
  order="ord two one"
  ((r % 2)) || order="one two ord"
  for m in $order; do
    case $m in ord) P=0 OS=auto ;; two) P=1 OS=0 ;; one) P=1 OS=1 ;; esac
    GW_ONE_SIDED=$OS GW_TRANSPORT=$t target/release/gwrun -n "$np" target/release/gwbench \
      allreduce -b "$min" -e "$max" -f 4 -n "$iters" -w 20 -c 0 -P $P 2>/dev/null |
      awk -v r="$r" -v m="$m" '/^\[0\] +[0-9]/ {print r, m, $2, $7}'
  done
done >"$rows"
python3 - "$rows" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(lambda: collections.defaultdict(dict))
for line in open(sys.argv[1]):
    r, m, size, us = line.split()
    d[int(size)][m][int(r)] = float(us)
print(f"{'bytes':>9} {'ordinary us':>12} {'two-sided us':>13} {'one-sided us':>13} {'ord/two':>8} {'ord/one':>8}   per-round ord/two | ord/one")
for size in sorted(d):
    x = d[size]
    med = lambda m: statistics.median(x[m].values())
    ratio = lambda m: statistics.median(x["ord"][r] / x[m][r] for r in x[m] if r in x["ord"])
    per = lambda m: " ".join(f"{x['ord'][r] / x[m][r]:.2f}" for r in sorted(x[m]) if r in x["ord"])
    print(f"{size:>9} {med('ord'):>12.1f} {med('two'):>13.1f} {med('one'):>13.1f} {ratio('two'):>8.2f} {ratio('one'):>8.2f}   {per('two')} | {per('one')}")
PY
