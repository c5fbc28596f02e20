#!/usr/bin/env bash
# Runs every gradwire test: installs what the tests need (iproute2 for the
# network-namespace tests, slurm-wlm and munge for the two-node Slurm
# cluster, gcc for the C ABI tests, OpenMPI for the peer benchmark's
# check, libfabric and rdma-core's
# headers for the RDMA transports, numpy/scikit-learn/pytest for the Python
# ones, NVRTC from PyPI for the GPU kernels), builds every binary the
# multi-process tests launch,
# then runs the tests in tiers:
#   1. unit and simulator tests (fast, no processes): a failure stops here;
#   2. the C ABI's unit tests without the step protocol (the default build);
#   3. integration tests (real rank processes, sockets, shared memory,
#      namespaces) and doc tests;
#   4. the Python tests.
# The closing line counts every test and every failing target
# (scripts/test-summary.awk), and the exit status follows it.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v cc >/dev/null 2>&1 || need+=(gcc)
# libfabric (the ofi transport and its tests over the tcp and shm providers)
# and rdma-core's headers (the verbs transport's build).
[[ -e /usr/include/rdma/fabric.h ]] || need+=(libfabric-dev)
command -v fi_info >/dev/null 2>&1 || need+=(libfabric-bin)
[[ -e /usr/include/infiniband/verbs.h ]] || need+=(libibverbs-dev)
[[ -e /usr/include/rdma/rdma_cma.h ]] || need+=(librdmacm-dev)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || need+=(libclang-dev)
# OpenMPI: the peer benchmark program (bench/peers/mpi_coll.c) is checked
# for correct results (bench/tests/peer_programs.rs).
command -v mpicc.openmpi >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

# Installed above: the peer program's test must run, not skip.
if command -v mpicc.openmpi >/dev/null 2>&1; then
  export GW_TEST_MPI=required
fi

# Network namespaces: where this machine can make them, the tests that use
# them must run (a failure to make them is then a test failure, not a skip).
probe="gwprobe$$"
if ip netns add "$probe" 2>/dev/null; then
  ip netns del "$probe"
  export GW_TEST_NETNS=required
  # Slurm and munge for the two-node cluster test (9 packages, about 4 MB;
  # installed by the cluster's script, which leaves out their recommends,
  # some 30 packages the test does not need). Where they install, the test
  # must run.
  if scripts/slurm-cluster.sh install; then
    export GW_TEST_SLURM=required
  else
    echo "test.sh: WARNING: cannot install Slurm here; the Slurm cluster test will be SKIPPED" >&2
  fi
else
  echo "test.sh: WARNING: cannot create network namespaces here; the multi-host tests will be SKIPPED" >&2
fi

# NVRTC from PyPI (no GPU needed): gw-cuda's tests compile every generated
# reduction kernel to PTX with it, and must (not skip) wherever it installs.
if GW_NVRTC_LIB=$(scripts/cuda-deps.sh); then
  export GW_NVRTC_LIB GW_TEST_NVRTC=required
else
  echo "test.sh: WARNING: cannot install NVRTC here; the kernel compilation tests will be SKIPPED" >&2
fi

# The Python packages (torch is about 3 GB of wheels) download while Rust
# builds: the download waits on the network, the build on the processors.
# Waited for before tier 3, which needs them.
pydeps_log=$(mktemp)
# In a process group of its own, so that pip goes with it.
setsid ./scripts/python-deps.sh >"$pydeps_log" 2>&1 &
pydeps_pid=$!
# A failed build stops this script; the download must not outlive it.
cleanup() {
  [[ -n $pydeps_pid ]] && kill -- -"$pydeps_pid" 2>/dev/null
  rm -f "$pydeps_log" ${log:+"$log"}
}
trap cleanup EXIT

# libgradwire with the job server's step protocol: the C and Python step
# tests need it (the default build leaves the HTTP client out); the verbs
# backend (gw-collectives/verbs, which builds gw-transport's and gw-verbs'
# on rdma-sys), so that it is compiled, linted and its no-device path
# tested (its device tests are ignored without GW_TEST_RDMA_DEVICE).
features=(--features gw-capi/step --features gw-collectives/verbs)

cargo fmt --all -- --check
# --lib as well: the C ABI tests need libgradwire.so and .a, which --bins skips.
cargo build --workspace --bins --lib "${features[@]}"
cargo clippy --workspace --all-targets "${features[@]}" -- -D warnings

log=$(mktemp)
summary() { awk -v stages="${1:-}" -f scripts/test-summary.awk "$log"; }

set +e
echo "== tier 1: unit and simulator tests"
cargo test --workspace --lib --bins "${features[@]}" 2>&1 | tee "$log"
unit_status=${PIPESTATUS[0]}
if [[ $unit_status -ne 0 ]]; then
  summary "unit tests=$unit_status"
  echo "test.sh: unit tests failed; integration tests not run" >&2
  exit 1
fi

echo "== tier 2: the C ABI built without the step protocol"
# Unit tests only: this builds no libgradwire.so over the one built above.
cargo test -p gw-capi --lib 2>&1 | tee -a "$log"
capi_status=${PIPESTATUS[0]}

# Before tier 3: the Slurm test runs the Python example under srun.
pydeps_status=0
wait "$pydeps_pid" || pydeps_status=$?
pydeps_pid=
cat "$pydeps_log"
if ((pydeps_status != 0)); then
  echo "test.sh: scripts/python-deps.sh failed (exit $pydeps_status)" >&2
  exit 1
fi
# python-deps.sh installed torch: its tests must run, not skip.
export GW_TEST_TORCH=required

echo "== tier 3: integration and doc tests"
# The multi-process tests start several rank processes each; two test threads
# keep a 2-core machine busy without starving ranks of CPU for minutes.
cargo test --workspace --test '*' "${features[@]}" --no-fail-fast -- --test-threads=2 2>&1 | tee -a "$log"
int_status=${PIPESTATUS[0]}
cargo test --workspace --doc "${features[@]}" 2>&1 | tee -a "$log"
doc_status=${PIPESTATUS[0]}
set -e

echo "== tier 4: Python"
# The binding and the data-parallel training example load
# target/debug/libgradwire.so, built above.
set +e
python3 -m pytest -q python/tests 2>&1 | tee -a "$log"
py_status=${PIPESTATUS[0]}

summary "C ABI without step=$capi_status,integration tests=$int_status,doc tests=$doc_status,python tests=$py_status"
exit $?
