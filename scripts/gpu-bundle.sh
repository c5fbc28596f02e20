#!/usr/bin/env bash
# Builds, here, everything the GPU check needs into DIR, so that a machine
# with an NVIDIA driver and Python 3 (numpy; torch for the collective
# checks and Gloo) runs it without Rust or a network:
#   scripts/gpu-bundle.sh DIR && DIR/gpu-check.sh [FIGURES_DIR]
# Release builds, stripped: gwrun, gwbench, libgradwire.so and its header,
# the Python package, gw-cuda's test executables, the check scripts.
set -euo pipefail
DIR=${1:?usage: scripts/gpu-bundle.sh DIR}
cd "$(dirname "$0")/.."
rm -rf "$DIR"
mkdir -p "$DIR"/{bin,lib,include,tests,python}
cargo build --release -p gw-launch -p gw-bench -p gw-capi --bins --lib
cp target/release/gwrun target/release/gwbench "$DIR/bin/"
cp target/release/libgradwire.so "$DIR/lib/"
cp capi/include/gradwire.h "$DIR/include/"
cargo test --release -p gw-cuda --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
' | while read -r exe; do
    name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
    cp "$exe" "$DIR/tests/gw_cuda-$name"
  done
cp -r python/gradwire "$DIR/python/"
find "$DIR/python" -name __pycache__ -prune -exec rm -rf {} +
cp scripts/gpu/gpu_collectives.py scripts/gpu/gpu-check.sh "$DIR/"
chmod +x "$DIR/gpu-check.sh"
strip "$DIR"/bin/* "$DIR"/lib/*.so "$DIR"/tests/* 2>/dev/null || true
du -sh "$DIR"
size=$(du -sm "$DIR" | cut -f1)
if [ "$size" -gt 48 ]; then
  echo "gpu-bundle: $DIR is ${size} MiB, over the 48 MiB limit" >&2
  exit 1
fi
