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
cargo test --workspace -- --test-threads=2
