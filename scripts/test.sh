#!/usr/bin/env bash
# Runs every gradwire test: installs what the tests need (iproute2 for the
# network-namespace test, gcc for the C ABI tests, numpy/scikit-learn/pytest
# for the Python ones), builds every binary the multi-process tests launch,
# then runs the whole workspace's tests and the Python tests.
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
# --lib as well: the C ABI tests need libgradwire.so and .a, which --bins skips.
cargo build --workspace --bins --lib
cargo clippy --workspace --all-targets -- -D warnings
# The multi-process tests start several rank processes each; two test threads
# keep a 2-core machine busy without starving ranks of CPU for minutes.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$log"
rust_status=${PIPESTATUS[0]}
set -e

# The Python binding and the data-parallel training example (issue 5): they
# load target/debug/libgradwire.so, built above.
./scripts/python-deps.sh
set +e
python3 -m pytest -q python/tests 2>&1 | tee -a "$log"
py_status=${PIPESTATUS[0]}
set -e

# One closing line for everything (cargo prints one per test binary, pytest its own).
awk '/^test result:/ { p += $4; f += $6; i += $8 }
     /^(=+ )?[0-9]+ (passed|failed|errors?)[ ,]/ {
       for (k = 1; k < NF; k++) {
         if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^skipped/) i += $k
       }
     }
     END { printf "tests: %d passed, %d failed", p, f; if (i) printf ", %d skipped", i; print "" }' "$log"
if [[ $rust_status -ne 0 || $py_status -ne 0 ]]; then exit 1; fi
