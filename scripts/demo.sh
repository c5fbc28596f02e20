#!/usr/bin/env bash
# The main job: builds gradwire in release mode and runs the all-reduce
# benchmark on 4 local ranks through the gwrun launcher, with every result
# checked exactly (#wrong must be 0 on every row).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
exec ./target/release/gwrun -n 4 gwbench allreduce -b 8 -e 64M -f 4 -c 1
