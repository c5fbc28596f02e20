#!/usr/bin/env bash
# Installs NVRTC, CUDA's run-time compiler, from PyPI (nvidia-cuda-nvrtc,
# about 60 MB: no GPU, driver or toolkit needed) so that the tests can
# compile every generated reduction kernel to PTX, and prints the path of
# libnvrtc for GW_NVRTC_LIB. Idempotent; fast when it is present.
#   export GW_NVRTC_LIB=$(./scripts/cuda-deps.sh)
set -euo pipefail
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
find_lib() {
  "$PY" - <<'PYEOF'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(1)
for root in list(nvidia.__path__):
    for pat in ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.12", "*/lib/libnvrtc.so.*"):
        hits = sorted(h for h in glob.glob(os.path.join(root, pat)) if "builtins" not in h)
        if hits:
            print(hits[0])
            sys.exit(0)
sys.exit(1)
PYEOF
}
if ! find_lib >/dev/null 2>&1; then
  echo "cuda-deps: installing nvidia-cuda-nvrtc (NVRTC, about 60 MB)" >&2
  "$PY" -m pip install -q --root-user-action=ignore 'nvidia-cuda-nvrtc>=13,<14' >&2
fi
find_lib || { echo "cuda-deps: libnvrtc not found after installing nvidia-cuda-nvrtc" >&2; exit 1; }
