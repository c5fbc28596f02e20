#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, so that gradwire can be run
# (and tested) under srun and sbatch as on an HPC site, without one.
#
# Each node is a network namespace with its own address and host name
# (gwnode1 at 198.18.210.1, gwnode2 at 198.18.210.2, joined by a veth pair;
# 198.18.0.0/15 is the benchmarking range, never routed), running its own
# slurmd; slurmctld runs on gwnode1, which is also the login node. One
# munged serves both (it is reached through a Unix socket, which namespaces
# do not separate). Everything the daemons write lives under the state
# directory.
#
#   scripts/slurm-cluster.sh install  install Slurm and munge if missing (Debian's
#                                     packages, without their recommends)
#   scripts/slurm-cluster.sh up       install if missing, start it all
#   scripts/slurm-cluster.sh down     stop every daemon, delete the namespaces
#   scripts/slurm-cluster.sh status   daemons and sinfo
#   scripts/slurm-cluster.sh exec CMD...   run CMD on the login node (srun, sbatch, ...)
#   scripts/slurm-cluster.sh on NODE CMD... run CMD on NODE (scontrol listpids, ...)
#
# Both `up` and `down` are idempotent: `up` on a healthy cluster does
# nothing, on a broken one starts over. Needs root (namespaces, daemons).
#
# Environment: GW_SLURM_DIR (state directory, default /tmp/gw-slurm),
# GW_SLURM_NS (prefix of the namespaces' and links' names, at most 12
# characters, default gwslurm: two clusters with different ones and state
# directories run side by side), GW_SLURM_CPUS (CPUs each node offers,
# default 2).
set -euo pipefail

dir=${GW_SLURM_DIR:-/tmp/gw-slurm}
cpus=${GW_SLURM_CPUS:-2}
conf=$dir/slurm.conf
net=198.18.210
nodes=(gwnode1 gwnode2)
prefix=${GW_SLURM_NS:-gwslurm}
((${#prefix} <= 12)) || { echo "slurm-cluster.sh: GW_SLURM_NS=$prefix is longer than 12 characters" >&2; exit 1; }
ns() { echo "$prefix-$1"; }
login=${nodes[0]}

die() {
  echo "slurm-cluster.sh: $*" >&2
  exit 1
}

install() {
  local need=()
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v unshare >/dev/null 2>&1 || need+=(util-linux)
  command -v munged >/dev/null 2>&1 || need+=(munge)
  command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
  ((${#need[@]})) || return 0
  echo "slurm-cluster.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
    --no-install-recommends "${need[@]}"
  # The packages enable the system's own daemons; this cluster runs its own.
  for s in munge slurmctld slurmd; do
    systemctl disable --now "$s" >/dev/null 2>&1 || true
  done
}

# Runs "$@" on node $1: in its network namespace, with a host name and an
# /etc/hosts of its own (private UTS and mount namespaces). Not `ip netns
# exec`, which remounts /sys and so hides the cgroup mounts slurmd needs.
on() {
  local node=$1
  shift
  SLURM_CONF=$conf nsenter --net="/run/netns/$(ns "$node")" \
    unshare --mount --uts --propagation private \
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' \
    "$dir/hosts" "$node" "$@"
}

write_conf() {
  mkdir -p "$dir"/{ctld,log,munge} "${nodes[@]/#/$dir/spool/}"
  chmod 0755 "$dir"
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' \
    "$net" "${nodes[0]}" "$net" "${nodes[1]}" >"$dir/hosts"
  cat >"$conf" <<EOF
# Written by scripts/slurm-cluster.sh.
ClusterName=gradwire
SlurmctldHost=${nodes[0]}($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# No cgroups here: processes are tracked through /proc, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# The nodes offer what this file says, whatever the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
# sbatch --wait polls the job at 2 s, then every 4x longer until past half
# this age (capped at 32 s): at 30 that is 2, 10, 42 s, at 10 every 8 s.
MinJobAge=10
InactiveLimit=0
NodeName=${nodes[0]} NodeAddr=$net.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=${nodes[1]} NodeAddr=$net.2 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=gw Nodes=${nodes[0]},${nodes[1]} Default=YES MaxTime=INFINITE State=UP
EOF
}

make_net() {
  local a b
  a=$(ns "${nodes[0]}")
  b=$(ns "${nodes[1]}")
  ip netns add "$a"
  ip netns add "$b"
  ip link add "$prefix-v1" type veth peer name "$prefix-v2"
  ip link set "$prefix-v1" netns "$a"
  ip link set "$prefix-v2" netns "$b"
  local i=1
  for node in "${nodes[@]}"; do
    local n
    n=$(ns "$node")
    ip -n "$n" addr add "$net.$i/24" dev "$prefix-v$i"
    ip -n "$n" link set "$prefix-v$i" up
    ip -n "$n" link set lo up
    i=$((i + 1))
  done
}

start_munge() {
  # munged insists that its key and directories be its own and private.
  chmod 0700 "$dir/munge"
  [[ -s $dir/munge/munge.key ]] || {
    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 0400 "$dir/munge/munge.key"
  }
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" \
    --log-file="$dir/log/munged.log"
}

# Waits (bounded) for both nodes to be idle in sinfo.
wait_idle() {
  local i states
  for ((i = 0; i < 120; i++)); do
    states=$(on "$login" sinfo -h -N -o '%N %t' 2>/dev/null || true)
    if [[ $(grep -c ' idle$' <<<"$states") -eq ${#nodes[@]} ]]; then
      return 0
    fi
    sleep 0.5
  done
  echo "slurm-cluster.sh: the nodes did not become idle within 60 s; sinfo says:" >&2
  echo "$states" >&2
  tail -n 20 "$dir"/log/*.log >&2 || true
  return 1
}

healthy() {
  [[ -e /run/netns/$(ns "$login") ]] || return 1
  local states
  states=$(on "$login" timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [[ $(grep -cE ' (idle|mix|alloc)$' <<<"$states") -eq ${#nodes[@]} ]]
}

up() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces and the daemons)"
  install
  if healthy; then
    echo "slurm-cluster.sh: already up (state in $dir)"
    return 0
  fi
  down >/dev/null 2>&1 || true
  write_conf
  make_net
  start_munge
  on "$login" slurmctld -f "$conf" ||
    die "slurmctld did not start: see $dir/log/slurmctld.log"
  for node in "${nodes[@]}"; do
    on "$node" slurmd -f "$conf" -N "$node" ||
      die "slurmd on $node did not start: see $dir/log/slurmd-$node.log"
  done
  wait_idle
  echo "slurm-cluster.sh: up: nodes ${nodes[*]}, login node $login; run commands there with"
  echo "  $0 exec srun -N 2 -n 4 hostname"
}

down() {
  # Every process in the cluster's namespaces is one of its daemons or a
  # job's task: none outlives the cluster.
  for node in "${nodes[@]}"; do
    local n
    n=$(ns "$node")
    if [[ -e /run/netns/$n ]]; then
      local pids
      pids=$(ip netns pids "$n" 2>/dev/null || true)
      [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
    fi
  done
  if [[ -s $dir/munge/munged.pid ]]; then
    kill "$(cat "$dir/munge/munged.pid")" 2>/dev/null || true
    rm -f "$dir/munge/munged.pid"
  fi
  for node in "${nodes[@]}"; do
    local n
    n=$(ns "$node")
    [[ ! -e /run/netns/$n ]] || ip netns del "$n"
  done
  # Job state from an earlier run would be recovered by the next slurmctld.
  rm -rf "$dir/ctld" "$dir/spool" "$dir"/*.pid
  echo "slurm-cluster.sh: down"
}

status() {
  local n=0
  for f in "$dir/munge/munged.pid" "$dir/slurmctld.pid" "$dir"/slurmd-*.pid; do
    [[ -s $f ]] || continue
    if kill -0 "$(cat "$f")" 2>/dev/null; then
      echo "running: $(basename "$f" .pid) (pid $(cat "$f"))"
      n=$((n + 1))
    else
      echo "dead: $(basename "$f" .pid)"
    fi
  done
  healthy && on "$login" sinfo -N || {
    echo "slurm-cluster.sh: not up ($n daemons running)"
    return 1
  }
}

case "${1:-}" in
  install) install ;;
  up) up ;;
  down) down ;;
  status) status ;;
  exec)
    shift
    (($#)) || die "exec needs a command"
    on "$login" "$@"
    ;;
  on)
    (($# >= 3)) || die "on needs a node and a command"
    [[ " ${nodes[*]} " == *" $2 "* ]] || die "no node $2 (nodes: ${nodes[*]})"
    node=$2
    shift 2
    on "$node" "$@"
    ;;
  *) die "usage: $0 install|up|down|status|exec CMD...|on NODE CMD..." ;;
esac
