#!/usr/bin/env bash
# Installs what the Python tests need: numpy, scikit-learn, pytest, torch,
# and the gradwire package from python/. Idempotent; fast when everything is present.
#   ./scripts/python-deps.sh && python3 -m pytest -q python/tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# wheel: lets pip build ./python without build isolation (no index needed then).
have() { "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "$@"; }
if ! have numpy sklearn pytest wheel; then
  echo "python-deps: installing numpy scikit-learn pytest wheel"
  "$PY" -m pip install -q --root-user-action=ignore numpy scikit-learn pytest wheel
fi

# PyTorch, for the c10d backend's tests (gradwire.torch): torch 2.15 from
# PyPI with its default dependencies (about 3 GB of wheels, most of them
# CUDA libraries that the CPU tests do not use but without which torch does
# not import; 34 s to install on the development VM).
if ! have torch; then
  echo "python-deps: installing torch (about 3 GB)"
  "$PY" -m pip install -q --root-user-action=ignore 'torch>=2.10'
fi

# Reinstall the package only when python/ or the header changed since the last install.
stamp_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$stamp_dir"
stamp="$stamp_dir/.python-deps.stamp"
sum=$( (find python \( -path python/tests -o -path python/build -o -name '*.egg-info' \) -prune -o -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' \) -print0 \
         | sort -z | xargs -0 cat; cat capi/include/gradwire.h; echo "$PY") | sha256sum | cut -d' ' -f1)
# The installed package finds the library in the checkout it was built from;
# one built from another checkout (moved, or deleted) must be built again.
built_from() {
  (cd / && "$PY" -c "import json, os, importlib.util as u
s = u.find_spec('gradwire')
p = s and os.path.join(os.path.dirname(s.origin), '_build_info.json')
print(json.load(open(p)).get('repo') if p and os.path.isfile(p) else '')" 2>/dev/null) || true
}
if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]] || ! (cd / && have gradwire) || [[ $(built_from) != "$PWD" ]]; then
  echo "python-deps: pip install ./python"
  # No build isolation: setuptools is already here, so no index is needed.
  "$PY" -m pip install -q --root-user-action=ignore --no-build-isolation --no-deps --force-reinstall ./python
  rm -rf python/build python/gradwire.egg-info
  echo "$sum" >"$stamp"
fi
