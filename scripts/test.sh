#!/usr/bin/env bash
# Runs every gradwire test: installs what the tests need (iproute2 for the
# network-namespace test), builds every binary the multi-process tests launch,
# then runs the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v cc >/dev/null 2>&1 || need+=(gcc)
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

cargo fmt --all -- --check
cargo build --workspace --bins
cargo clippy --workspace --all-targets -- -D warnings
# The multi-process tests start several rank processes each; two test threads
# keep a 2-core machine busy without starving ranks of CPU for minutes.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace -- --test-threads=2 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole workspace (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     END { printf "tests: %d passed, %d failed", p, f; if (i) printf ", %d skipped", i; print "" }' \
  "$log" | sed 's/;//g'
exit "$status"
