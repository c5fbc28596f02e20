#!/usr/bin/env bash
# Small collectives through the C ABI against MPI, in the same run.
#
# bench/capi/small_calls.c times a barrier, an 8-byte all-reduce and an
# 8-byte broadcast through gradwire's C ABI (the path of C programs, the
# numpy binding and the PyTorch backend; gwbench times the Rust API);
# bench/peers/mpi_small_calls.c does the same calls through MPI. Each
# round runs gradwire and every MPI found (OpenMPI with ob1 over vader or
# tcp; MPICH), gradwire first in odd rounds and last in even ones; the
# verdict per call is the median over rounds of mpi/gradwire time (above
# 1: gradwire faster), with every round's ratio.
#
#   scripts/small-calls.sh [-t shm|tcp] [-p RANKS] [-r ROUNDS] [-T SECONDS]
#   (defaults: shm, 2 ranks, 3 rounds, loops of 0.2 s)
set -euo pipefail
cd "$(dirname "$0")/.."
t=shm np=2 rounds=3 secs=0.2
while getopts "t:p:r:T:h" o; do
  case $o in
  t) t=$OPTARG ;; p) np=$OPTARG ;; r) rounds=$OPTARG ;; T) secs=$OPTARG ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
[[ $t == shm || $t == tcp ]] || { echo "small-calls.sh: -t is shm or tcp, not '$t'" >&2; exit 2; }
cargo build --release -q -p gw-capi -p gw-launch
out=target/small-calls
mkdir -p "$out"
lib=$PWD/target/release
cc -O2 -I capi/include -o "$out/small_calls" bench/capi/small_calls.c \
  -L "$lib" -lgradwire -Wl,-rpath,"$lib"
peers=()
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
  mpicc.openmpi -O2 -o "$out/mpi_small_calls.openmpi" bench/peers/mpi_small_calls.c
  peers+=(openmpi)
else
  echo "# skipped openmpi: mpicc.openmpi or mpirun.openmpi not found (Debian: openmpi-bin libopenmpi-dev)"
fi
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
  mpicc.mpich -O2 -o "$out/mpi_small_calls.mpich" bench/peers/mpi_small_calls.c
  peers+=(mpich)
else
  echo "# skipped mpich: mpicc.mpich or mpirun.mpich not found (Debian: mpich libmpich-dev)"
fi
run() {
  case $1 in
  gradwire) GW_TRANSPORT=$t target/release/gwrun -n "$np" "$out/small_calls" -T "$secs" ;;
  openmpi)
    btl=(--mca btl self,vader)
    [[ $t == tcp ]] && btl=(--mca btl tcp,self --mca btl_tcp_if_include lo)
    mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 "${btl[@]}" \
      -np "$np" "$out/mpi_small_calls.openmpi" -T "$secs" ;;
  mpich)
    # MPICH picks shared memory within a host; over tcp it is told not to,
    # and its UCX to use TCP (as compare-collectives.py does). 300 s: its
    # ranks were seen to spin without end now and then.
    env=()
    [[ $t == tcp ]] && env=(MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self)
    env "${env[@]}" timeout 300 mpirun.mpich -np "$np" "$out/mpi_small_calls.mpich" -T "$secs" ;;
  esac 2>/dev/null | sed 's/^\[0\] //' | awk -v r="$2" -v who="$1" '/coll=/ {print r, who, $0}'
}
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for r in $(seq 1 "$rounds"); do
  order=(gradwire "${peers[@]}")
  ((r % 2)) || order=("${peers[@]}" gradwire)
  # A failed launch (MPICH's timeout, say) costs its round, not the run.
  for who in "${order[@]}"; do run "$who" "$r" || echo "# $who round $r failed (exit $?)" >&2; done
done >"$rows"
python3 - "$rows" "$t" "$np" <<'PY'
import collections, re, statistics, sys
rows, t, np = sys.argv[1], sys.argv[2], sys.argv[3]
d = collections.defaultdict(lambda: collections.defaultdict(dict))
for line in open(rows):
    r, who, rest = line.split(maxsplit=2)
    f = dict(re.findall(r"(\w+)=(\S+)", rest))
    if f.get("wrong") != "0":
        sys.exit(f"{who} {f.get('coll')} round {r}: wrong results ({f.get('wrong')})")
    d[f["coll"]][who][int(r)] = float(f["time_us"])
print(f"# {t}, {np} ranks: median us over rounds; peer/gradwire: median of per-round ratios [min-max], above 1 gradwire faster")
peers = sorted({w for c in d.values() for w in c} - {"gradwire"})
print(f"{'call':>10} {'gradwire':>9}" + "".join(f" {p:>9}" for p in peers)
      + "".join(f" {p + '/gradwire':>24}" for p in peers))
for coll, x in d.items():
    g = x["gradwire"]
    line = f"{coll:>10} {statistics.median(g.values()):>9.3f}"
    for p in peers:
        line += f" {statistics.median(x[p].values()):>9.3f}" if x[p] else f" {'-':>9}"
    for p in peers:
        rs = [x[p][r] / g[r] for r in g if r in x[p]]
        line += (f" {statistics.median(rs):>8.2f} [{min(rs):.2f}-{max(rs):.2f}]".rjust(25)
                 if rs else f" {'-':>24}")
    print(line)
PY
