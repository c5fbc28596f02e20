#!/usr/bin/env bash
# The main job: builds gradwire in release mode and runs a 4-rank job on this
# machine through the gwrun launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
exec ./target/release/gwrun -n 4 gwtest exchange 0 1 4095 1048579 67108864
