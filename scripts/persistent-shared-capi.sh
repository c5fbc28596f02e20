#!/usr/bin/env bash
# Ordinary against persistent all-reduce through the C ABI: a second check.
#
# bench/capi/persistent_shared.c times, in one program, gwAllReduce (ord),
# gwAllReduceInit + gwStart/gwWait on the program's buffers (pers) and
# gwAllReduceInitShared's buffers (shared), modes in alternating order per
# round; it shares no code with gwbench, so a claim of
# scripts/persistent-vs-ordinary.sh can be checked against it. The verdict
# per size is the median over rounds of ord/pers and ord/shared (above 1:
# the persistent form faster), with the [min-max] of every round's ratio.
#
#   scripts/persistent-shared-capi.sh [-t shm|tcp] [-p RANKS] [-r ROUNDS]
#                                     [-T SECONDS] [-b MIN] [-e MAX] [-w 0|1]
#   (defaults: shm, 2 ranks, 5 rounds, loops of 0.2 s, 1K to 16M bytes;
#   -w 1: each step rewrites its send buffer first, as a backward pass does)
set -euo pipefail
cd "$(dirname "$0")/.."
t=shm np=2 rounds=5 secs=0.2 min=1K max=16M w=0
while getopts "t:p:r:T:b:e:w:h" o; do
  case $o in
  t) t=$OPTARG ;; p) np=$OPTARG ;; r) rounds=$OPTARG ;; T) secs=$OPTARG ;;
  b) min=$OPTARG ;; e) max=$OPTARG ;; w) w=$OPTARG ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
[[ $t == shm || $t == tcp ]] || { echo "persistent-shared-capi.sh: -t is shm or tcp, not '$t'" >&2; exit 2; }
cargo build --release -q -p gw-capi -p gw-launch
out=target/persistent-shared-capi
mkdir -p "$out"
lib=$PWD/target/release
cc -O2 -I capi/include -o "$out/persistent_shared" bench/capi/persistent_shared.c \
  -L "$lib" -lgradwire -Wl,-rpath,"$lib"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# All rounds run in one launch (the program alternates the modes' order
# itself). Its lines are kept even when it fails, so that the rounds that
# finished are still summarised; the failure is reported at the end.
rc=0
GW_TRANSPORT=$t target/release/gwrun -n "$np" "$out/persistent_shared" \
  -T "$secs" -r "$rounds" -b "$min" -e "$max" -w "$w" | tee /dev/stderr | grep 'mode=' >"$rows" || rc=$?
python3 - "$rows" "$t" "$np" <<'PY' || rc=$((rc ? rc : $?))
import collections, re, statistics, sys
rows, t, np = sys.argv[1], sys.argv[2], sys.argv[3]
d = collections.defaultdict(lambda: collections.defaultdict(dict))
wrong = 0
for line in open(rows):
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    wrong += int(f["wrong"])
    d[int(f["bytes"])][f["mode"]][int(f["round"])] = float(f["time_us"])
print(f"# {t}, {np} ranks: median us over rounds; ord/X: median of per-round ratios [min-max], above 1 X faster")
modes = ["ord", "pers", "shared"]
print(f"{'bytes':>9}" + "".join(f" {m + ' us':>11}" for m in modes)
      + "".join(f" {'ord/' + m:>20}" for m in modes[1:]))
for size in sorted(d):
    x = d[size]
    med = lambda m: statistics.median(x[m].values()) if x[m] else float("nan")
    def ratio(m):
        # Ratios within a round only: there the two ran side by side in time.
        rs = [x["ord"][r] / x[m][r] for r in x[m] if r in x["ord"]]
        if not rs:
            return "-"
        return f"{statistics.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]"
    print(f"{size:>9}" + "".join(f" {med(m):>11.2f}" for m in modes)
          + "".join(f" {ratio(m):>20}" for m in modes[1:]))
print(f"wrong elements: {wrong}")
sys.exit(1 if wrong else 0)
PY
exit "$rc"
