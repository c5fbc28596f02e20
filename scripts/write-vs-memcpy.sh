#!/usr/bin/env bash
# One-sided write bandwidth against one thread's memcpy, in the same run.
#
# The issue's target: `gwbench p2p --op write` over GW_TRANSPORT=ofi with
# libfabric's shm provider reaches at least 70% of single-thread memcpy
# bandwidth from 1 MiB up. Each round runs memcpy_bw (bench/peers) at every
# size, then gwbench p2p --op write over ofi/shm and over gradwire's own
# shm transport, so that the machine's speed of the moment is shared by
# all; the verdict per size is the median over rounds of write/memcpy.
# Both run twice per round: on ordinary 4 KiB pages, and with every buffer
# advised onto transparent huge pages (memcpy_bw's HUGE, gwbench's
# --hugepages 1), on which the kernel's cross-memory copy pins the peer's
# pages far faster (bench/src/pages.rs). One table per kind of page.
#
#   scripts/write-vs-memcpy.sh [ROUNDS]      (default 5; sizes 1, 4, 16, 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
sizes_mib=(1 4 16 64)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -o "$out/memcpy_bw" bench/peers/memcpy_bw.c
cargo build --release -q -p gw-bench -p gw-launch
for r in $(seq 1 "$rounds"); do
  for huge in 0 1; do
    for m in "${sizes_mib[@]}"; do
      "$out/memcpy_bw" "$m" 9 "$huge" |
        awk -v r="$r" -v m="$m" -v h="$huge" '{split($4, g, "="); print h, r, "memcpy", m * 1048576, g[2]}'
    done
    for t in ofi-shm shm; do
      env GW_TRANSPORT="${t%%-*}" GW_OFI_PROVIDER=shm target/release/gwrun -n 2 \
        target/release/gwbench p2p --op write -b 1M -e 64M -f 4 -n 64 -c 1 --hugepages "$huge" 2>/dev/null |
        awk -v r="$r" -v t="$t" -v h="$huge" '/^\[0\] +[0-9]/ {print h, r, t, $2, $5}'
    done
  done
done >"$out/rows"
python3 - "$out/rows" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(dict)))
for line in open(sys.argv[1]):
    huge, r, what, size, gbps = line.split()
    rows[int(huge)][int(size)][what][int(r)] = float(gbps)
med = lambda v: statistics.median(v) if v else float("nan")
for huge in sorted(rows):
    print("pages:", "transparent huge pages (--hugepages 1)" if huge else "4 KiB (default)")
    print(f"{'bytes':>10} {'memcpy GB/s':>12} {'ofi-shm GB/s':>13} {'shm GB/s':>9} {'ofi-shm/memcpy':>15} {'shm/memcpy':>11}   ratio range over rounds")
    for size in sorted(rows[huge]):
        d = rows[huge][size]
        def ratios(t):
            return [d[t][r] / d["memcpy"][r] for r in d[t] if r in d["memcpy"]]
        ro, rs = ratios("ofi-shm"), ratios("shm")
        print(f"{size:>10} {med(list(d['memcpy'].values())):>12.2f} {med(list(d['ofi-shm'].values())):>13.2f} "
              f"{med(list(d['shm'].values())):>9.2f} {med(ro):>15.2f} {med(rs):>11.2f}   "
              f"ofi-shm {min(ro, default=0):.2f}-{max(ro, default=0):.2f}, shm {min(rs, default=0):.2f}-{max(rs, default=0):.2f}")
PY
