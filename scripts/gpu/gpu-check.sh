#!/usr/bin/env bash
# gradwire's GPU check: run on a machine with an NVIDIA GPU and driver,
# Python 3 with numpy and torch (CUDA build); no Rust, no network.
#   ./gpu-check.sh [FIGURES_DIR]
# Runs gw-cuda's GPU tests, the collectives on CUDA tensors at 1-4 ranks
# (IPC all-reduce, the staged path and its pipeline, persistent rounds, the
# Python calls), the persistent-against-ordinary timing and the bandwidth
# tables against Gloo and the host path at 2 and 4 ranks, then gwbench
# --device cuda (1, 2, 4 ranks; p2p at 2), and ends with "N passed, N failed"
# (exit status 1 if any failed).
# GW_CHECK_TIMEOUT / GW_BENCH_TIMEOUT bound each step (120 / 200 s).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FIG=${1:-$HERE/figures}
mkdir -p "$FIG"
export GRADWIRE_LIB=$HERE/lib/libgradwire.so GRADWIRE_HEADER=$HERE/include/gradwire.h
export PYTHONPATH=$HERE/python${PYTHONPATH:+:$PYTHONPATH} GW_TEST_CUDA=1
PATH=$HERE/bin:$PATH
# NVRTC: the toolkit's, or the one in Python's nvidia packages.
if [ -z "${GW_NVRTC_LIB:-}" ]; then
  for c in /usr/local/cuda/lib64/libnvrtc.so.1[0-9] /usr/local/cuda/lib64/libnvrtc.so \
           $(python3 -c 'import nvidia, glob, os; [print(p) for r in nvidia.__path__ for p in sorted(glob.glob(os.path.join(r, "*", "lib", "libnvrtc.so*"))) if "builtins" not in p]' 2>/dev/null); do
    if [ -e "$c" ]; then export GW_NVRTC_LIB=$c; break; fi
  done
fi
echo "# NVRTC: ${GW_NVRTC_LIB:-(loader default)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/# GPU: /'
pass=0; fail=0
LOG=$FIG/logs; mkdir -p "$LOG"
# Rust test executables: count their own result lines.
for t in "$HERE"/tests/*; do
  name=$(basename "$t")
  timeout 300 "$t" --include-ignored --test-threads=1 >"$LOG/$name.log" 2>&1
  rc=$?
  p=$(grep -o '[0-9]* passed' "$LOG/$name.log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -o '[0-9]* failed' "$LOG/$name.log" | awk '{s+=$1} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  echo "== $name: $p passed, $f failed (rc $rc)"
  [ "$f" -ne 0 ] && grep -E "panicked|FAILED|failed|error" "$LOG/$name.log" | head -20
done
# Collectives on CUDA tensors, rank 0's PASS lines and every FAIL.
check() {
  local label=$1; shift
  timeout "${GW_CHECK_TIMEOUT:-120}" "$@" >"$LOG/$label.log" 2>&1
  local rc=$?
  local p f
  # gwrun prefixes each line with [rank].
  p=$(grep -ho 'RESULT rank [0-9]*: [0-9]* passed, [0-9]* failed' "$LOG/$label.log" | awk '{s+=$4} END {print s+0}')
  f=$(grep -ho 'RESULT rank [0-9]*: [0-9]* passed, [0-9]* failed' "$LOG/$label.log" | awk '{s+=$6} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  echo "== $label: $p passed, $f failed (rc $rc)"
  grep -E 'FAIL|Error|error|panicked' "$LOG/$label.log" | head -20
}
cd "$HERE"
for n in 1 2 3 4; do
  check "collectives-ipc-$n" gwrun -n "$n" python3 gpu_collectives.py check
done
# Staged, in 64 KiB segments so that the pipeline runs many of them.
GW_CUDA_IPC=0 GW_CUDA_STAGE_BYTES=65536 check "collectives-staged-2" gwrun -n 2 python3 gpu_collectives.py check
GW_CHECK_BIG=1 check "collectives-4GiB-2" gwrun -n 2 python3 gpu_collectives.py check
# GW_CHECK_PROFILE=1: where the IPC all-reduce's time goes (not counted).
if [ "${GW_CHECK_PROFILE:-0}" = 1 ]; then
  for n in 2 4; do
    echo "== where the IPC all-reduce's time goes, $n ranks (microseconds per call)"
    timeout 120 gwrun -n "$n" python3 gpu_collectives.py profile 2>&1 | grep -E 'profile' | head -8
  done
fi
for n in 2 4; do
  echo "== persistent against ordinary, $n ranks"
  timeout 120 gwrun -n "$n" python3 gpu_collectives.py persistent "$FIG/persistent-$n.json" 2>&1 | grep -E '^\[0\] #' || true
done
for n in 2 4; do
  rm -f /tmp/gw-gloo-store-$n
  echo "== bench, $n ranks"
  GW_GLOO_STORE=/tmp/gw-gloo-store-$n timeout "${GW_BENCH_TIMEOUT:-200}" gwrun -n "$n" python3 gpu_collectives.py bench "$FIG/allreduce-$n.json" 2>&1 | tee "$LOG/bench-$n.log" | grep -E '^\[0\] (#| )' || true
done
# gwbench on device buffers: nccl-tests' columns, results checked (-c 1);
# last, as the tables above carry the targets.
gwbench_check() {
  local label=$1; shift
  timeout "${GW_CHECK_TIMEOUT:-120}" "$@" >"$LOG/$label.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ] && grep -q 'Out of bounds values : 0 OK' "$LOG/$label.log"; then
    pass=$((pass + 1)); echo "== $label: passed"
  else
    fail=$((fail + 1)); echo "== $label: FAILED (rc $rc)"; tail -5 "$LOG/$label.log"
  fi
  grep -E '^\[0\] +[0-9]' "$LOG/$label.log" | sed 's/^\[0\] //' | head -12
}
for n in 1 2 4; do
  gwbench_check "gwbench-allreduce-$n" gwrun -n "$n" gwbench allreduce --device cuda \
    -b 64K -e 256M -f 4 -c 1 -T 0.1 -J "$FIG/gwbench-allreduce-$n.json"
done
gwbench_check "gwbench-allreduce-persistent-2" gwrun -n 2 gwbench allreduce --device cuda -P 1 \
  -b 64K -e 1M -f 16 -c 1 -T 0.1 -J "$FIG/gwbench-allreduce-persistent-2.json"
for coll in reduce_scatter all_gather broadcast reduce; do
  gwbench_check "gwbench-$coll-2" gwrun -n 2 gwbench "$coll" --device cuda \
    -b 1M -e 16M -f 4 -c 1 -T 0.1 -J "$FIG/gwbench-$coll-2.json"
done
# Messages between device buffers, staged through pinned memory.
gwbench_check "gwbench-p2p-2" gwrun -n 2 gwbench p2p --device cuda \
  -b 4K -e 64M -f 4 -c 1 -T 0.05 -J "$FIG/gwbench-p2p-2.json"
echo "$pass passed, $fail failed"
# Status 1 when anything failed, so that a job running the check sees it.
[ "$fail" -eq 0 ]
