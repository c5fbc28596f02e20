#!/usr/bin/env bash
# Interleaved A/B of gradwire all-reduce variants on one machine.
#
# A shared, noisy machine changes speed by 1.2-3x from minute to minute, so
# variants are compared inside each round (A, B, C, A, B, C, ...), and the
# verdict is how many rounds each won and its median. A variant is either a
# set of environment settings for the same build, or another build's
# directory (holding gwrun and gwbench), e.g. one made from an older commit:
#
#   scripts/interleave.sh -t tcp -p 2 -s 1M -r 5 -n 200 -- default GW_ALGO=rd GW_SPIN_US=1000
#   scripts/interleave.sh -t shm -p 2 -s 64M -- @/tmp/base/release @target/release
#
# "default" runs the build under test with no extra settings; several
# settings for one variant are joined with commas (GW_LANES=4,GW_SPIN_US=0).
# Prints the time per call (us, gwbench's out-of-place column) per round and
# variant, then each variant's median and rounds won.
set -euo pipefail
cd "$(dirname "$0")/.."

transport=tcp ranks=2 size=1M rounds=5 iters=50 bin=target/release
usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  echo "options: -t tcp|shm  -p RANKS  -s SIZE  -r ROUNDS  -n ITERS  -b BUILD_DIR (default target/release)"
  exit 2
}
while getopts "t:p:s:r:n:b:h" o; do
  case $o in
  t) transport=$OPTARG ;;
  p) ranks=$OPTARG ;;
  s) size=$OPTARG ;;
  r) rounds=$OPTARG ;;
  n) iters=$OPTARG ;;
  b) bin=$OPTARG ;;
  *) usage ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
(($# >= 1)) || usage
[[ $transport == tcp || $transport == shm ]] || { echo "interleave: -t must be tcp or shm, not '$transport'" >&2; exit 2; }
[[ $ranks =~ ^[0-9]+$ && $rounds =~ ^[0-9]+$ && $iters =~ ^[0-9]+$ ]] ||
  { echo "interleave: -p, -r and -n take whole numbers" >&2; exit 2; }
for v in "$@"; do
  if [[ $v == @* ]]; then d=${v#@}; else d=$bin; fi
  for b in gwrun gwbench; do
    [[ -x $d/$b ]] || { echo "interleave: $d/$b not found (cargo build --release -p gw-jobserver -p gw-bench)" >&2; exit 2; }
  done
done

one() { # VARIANT -> us per call, or "fail"
  local v=$1 d=$bin env=()
  if [[ $v == @* ]]; then d=${v#@}; elif [[ $v != default ]]; then IFS=, read -r -a env <<<"$v"; fi
  env "${env[@]}" GW_TRANSPORT="$transport" "$d/gwrun" -n "$ranks" "$d/gwbench" allreduce \
    -b "$size" -e "$size" -n "$iters" -w $((iters / 10 + 1)) -c 0 2>&1 |
    awk '/^\[0\] +[0-9]+ / { t = $7 } END { print (t == "" ? "fail" : t) }'
}

declare -A times
echo "# $transport, $ranks ranks, $size, $iters iterations, us per call (out of place)"
for ((r = 1; r <= rounds; r++)); do
  line="round $r:"
  for v in "$@"; do
    t=$(one "$v")
    times[$v]+="$t "
    line+="  $v=$t"
  done
  echo "$line"
done
echo "# median over rounds, and rounds in which the variant was fastest"
for v in "$@"; do
  med=$(tr ' ' '\n' <<<"${times[$v]}" | grep -E '^[0-9.]+$' | sort -g |
    awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
  won=0
  for ((r = 1; r <= rounds; r++)); do
    mine=$(cut -d' ' -f"$r" <<<"${times[$v]}")
    best=1
    for w in "$@"; do
      other=$(cut -d' ' -f"$r" <<<"${times[$w]}")
      if [[ $mine == fail ]] || { [[ $other != fail ]] && awk -v a="$other" -v b="$mine" 'BEGIN { exit !(a < b) }'; }; then best=0; fi
    done
    won=$((won + best))
  done
  printf '  %-40s median %10s us   fastest in %d of %d rounds\n' "$v" "$med" "$won" "$rounds"
done
