#!/usr/bin/env bash
# The heterogeneous training demo: a job server and one node agent on this
# machine run the same 2-rank training job (gwtrain, an MLP trained by SGD)
# twice, where rank 1 is made 3x slower by doing its real forward/backward 3
# times per sample: first with the even split of every global batch, then with
# the OptPerf planner, which gives each rank a local batch it finishes in the
# same time. Both runs see identical global batches and combine gradients with
# the weighted all-reduce, so their final parameters must agree to rounding.
#
# It prints each run's predicted and measured step times, the local batches
# chosen, the parameters' largest relative difference, how much slower rank 1
# computed in the even run beside the requested slowdown, and the optimum
# step for the speeds the even run measured (the global batch split in
# proportion to each rank's throughput, plus the part of the step no split
# removes). It checks the demo's criteria (OptPerf's mean step within 10% of
# that optimum, measured within 15% of the prediction after warm-up,
# parameters within 1e-5 relative; exit status 1 if one is not met). The last
# line is 'optperf/even step time ratio: X.XX'.
#
# Tunables (environment): STEPS (80), BATCH (global batch, 2048), WARMUP (15),
# SLOWDOWN (3); BIN_DIR=DIR uses the gwjob and gwtrain already built in DIR
# instead of building (to run the demo on a machine without a toolchain);
# KEEP_DIR=DIR copies both runs' logs (even/ and optperf/: steps.jsonl,
# params.bin) there, for scripts/model-hetero-demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-80}
BATCH=${BATCH:-2048}
WARMUP=${WARMUP:-15}
SLOWDOWN=${SLOWDOWN:-3}
# Each run gets this long before the demo gives up on it.
JOB_TIMEOUT=${JOB_TIMEOUT:-600}

if [[ -n ${BIN_DIR:-} ]]; then
  bin="$(cd "$BIN_DIR" && pwd)"
else
  cargo build --release -p gw-jobserver -p gw-train
  bin="$(cd "${CARGO_TARGET_DIR:-target}/release" && pwd)"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gw-hetero.XXXXXX")
server_pid=""
agent_pid=""
cleanup() {
  local status=$?
  # Agent first: it stops its workers (their process groups) as it exits.
  for pid in $agent_pid $server_pid; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in $agent_pid $server_pid; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ $status -ne 0 ]]; then
    echo "hetero-demo: logs kept in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

GW_ADMIN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export GW_ADMIN_TOKEN

"$bin/gwjob" serve --listen 127.0.0.1:0 --db "$tmp/gw.db" >"$tmp/server.log" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 300); do
  url=$(sed -n 's/^gwjob: listening on \(http:[^ ]*\).*/\1/p' "$tmp/server.log" | head -n1)
  [[ -n $url ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $url ]]; then
  echo "hetero-demo: the job server did not start:" >&2
  cat "$tmp/server.log" >&2
  exit 1
fi
echo "job server at $url"

"$bin/gwjob" agent --server "$url" --node local --rack r0 --slots 2 --device-type cpu \
  >"$tmp/agent.log" 2>&1 &
agent_pid=$!

# A rank that reaches the all-reduce first polls for 1 ms and then sleeps
# until the slow rank arrives. Where the ranks share cores (with each other,
# the server or anything else on the machine) the sleeper's core goes to the
# slow rank, which then runs the rest of its batch faster: rank 1 would
# compute faster per sample in the even run than under any balanced split,
# and the optimum the report derives from the even run would promise a step
# no split reaches. Polling through the wait (1 s, longer than any step's)
# keeps each rank on its core as if it had a device of its own, so the speeds
# measured in one run hold for the other.
SPIN_US=1000000

# Submits one run and waits for it to end; fails unless it succeeded.
run_job() {
  local planner=$1 out=$2 id state="" deadline
  id=$("$bin/gwjob" submit --server "$url" --workers 2 --global-batch "$BATCH" \
    --planner "$planner" --name "hetero-$planner" --env "GW_SPIN_US=$SPIN_US" -- \
    "$bin/gwtrain" --steps "$STEPS" --slow-rank 1 --slowdown "$SLOWDOWN" --out "$out" --print-every 0)
  echo "submitted $planner run: job $id ($STEPS steps, global batch $BATCH)"
  deadline=$((SECONDS + JOB_TIMEOUT))
  while ((SECONDS < deadline)); do
    state=$("$bin/gwjob" status "$id" --server "$url" --json |
      sed -n 's/^  "state": "\([a-z]*\)".*/\1/p')
    case $state in
      succeeded) return 0 ;;
      failed | cancelled) break ;;
    esac
    sleep 0.5
  done
  echo "hetero-demo: job $id did not succeed (state: ${state:-unknown}):" >&2
  "$bin/gwjob" status "$id" --server "$url" >&2 || true
  tail -n 30 "$tmp/agent.log" >&2
  exit 1
}

run_job even "$tmp/even"
run_job optperf "$tmp/optperf"
if [[ -n ${KEEP_DIR:-} ]]; then
  mkdir -p "$KEEP_DIR"
  rm -rf "$KEEP_DIR/even" "$KEEP_DIR/optperf"
  cp -r "$tmp/even" "$tmp/optperf" "$KEEP_DIR/"
fi

echo
# The report's last line is the ratio; its exit status says whether the
# criteria held, and becomes the demo's.
"$bin/gwtrain" report --warmup "$WARMUP" --slowdown "$SLOWDOWN" --check even="$tmp/even" optperf="$tmp/optperf"
