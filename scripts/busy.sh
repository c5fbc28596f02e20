#!/usr/bin/env bash
# Runs a command while one busy process spins on processor CPU, as another
# job or a build would on a shared machine; the busy process ends with it.
#   scripts/busy.sh CPU COMMAND [ARGS...]
# e.g. scripts/busy.sh 1 python3 scripts/ab-builds.py B B --old-env GW_BIND_TO=none ...
set -euo pipefail
if [[ $# -lt 2 || ! $1 =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/busy.sh CPU COMMAND [ARGS...]" >&2
  exit 2
fi
cpu=$1
shift
taskset -c "$cpu" sh -c 'while :; do :; done' &
busy=$!
trap 'kill $busy 2>/dev/null || true' EXIT
"$@"
