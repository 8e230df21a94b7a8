#!/usr/bin/env bash
# Brings up a throwaway Slurm cluster on this one machine, from Debian's slurm-wlm and munge, with every
# file in one directory: a munge key and munged on its own socket, slurmctld, and NODES slurmd daemons
# (n1..nNODES, one process each, `slurmd -N nX`, each on its own port, all on 127.0.0.1). No systemd, no
# cgroups (proctrack/linuxproc, task/none), no accounting daemon. Must run as root (slurmd starts jobs as
# their user). Waits until `sinfo` shows every node idle.
#
# Usage: scripts/slurm/up.sh DIR [NODES [CPUS]]     (NODES: 2, 1..8; CPUS per node: 4)
#   then:  . DIR/env          (sets SLURM_CONF, so sinfo/srun/salloc/sbatch/scancel talk to this cluster)
#          sinfo; srun -N2 hostname; carls run --slurm experiments/graphreg-quick.ini
#   and:   scripts/slurm/down.sh DIR      (stops every daemon and job of the cluster; DIR is left)
#
# The nodes all run on this machine, so they share its file system; CPUS is what each node tells Slurm it has
# (SlurmdParameters=config_overrides), not a count of real cores. Exit status: 0 when the cluster is up,
# 1 when a daemon did not start (its log is printed), 2 on bad usage, 3 when slurm-wlm or munge is missing.
set -euo pipefail

usage() { echo "usage: $0 DIR [NODES [CPUS]]  (see the top of $0)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 3 ] || usage
case "$1" in -h|--help) sed -n '2,18p' "$0"; exit 0 ;; esac
dir=$1
nodes=${2:-2}
cpus=${3:-4}
[[ "$nodes" =~ ^[1-8]$ ]] || { echo "$0: NODES must be 1..8, not '$nodes'" >&2; exit 2; }
[[ "$cpus" =~ ^[1-9][0-9]?$ ]] || { echo "$0: CPUS must be 1..99, not '$cpus'" >&2; exit 2; }
for prog in munged slurmctld slurmd sinfo srun scontrol; do
  command -v "$prog" >/dev/null || { echo "$0: $prog not found: install slurm-wlm and munge" >&2; exit 3; }
done
[ "$(id -u)" -eq 0 ] || { echo "$0: must run as root (slurmd starts every job's processes)" >&2; exit 2; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
chmod 0700 "$dir"
mkdir -p "$dir/munge" "$dir/ctld"
chmod 0700 "$dir/munge"

# Ports: the controller's and one per slurmd, none of them listening now.
in_use() { ss -Htan "sport = :$1" 2>/dev/null | grep -q . ; }
pick_ports() {
  local n=$1 base p ok
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 30000))
    ok=1
    for p in $(seq "$base" $((base + n - 1))); do in_use "$p" && ok=0; done
    [ $ok -eq 1 ] && { echo "$base"; return 0; }
  done
  echo "$0: no free port range found" >&2
  return 1
}
base=$(pick_ports $((nodes + 1)))

# munge: its own key, socket, pid, seed and log in DIR (munged refuses to run as root without --force).
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
  || { echo "$0: munged did not start:" >&2; cat "$dir/munge/munged.log" >&2 || true; exit 1; }

host=$(hostname -s)
{
  echo "# A throwaway cluster made by $0 on $(date -u +%FT%TZ)."
  echo "ClusterName=carls$$"
  echo "SlurmctldHost=$host(127.0.0.1)"
  echo "SlurmctldPort=$base"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$dir/munge/munge.socket"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "StateSaveLocation=$dir/ctld"
  echo "SlurmdSpoolDir=$dir/slurmd.%n"
  echo "SlurmctldPidFile=$dir/slurmctld.pid"
  echo "SlurmdPidFile=$dir/slurmd.%n.pid"
  echo "SlurmctldLogFile=$dir/slurmctld.log"
  echo "SlurmdLogFile=$dir/slurmd.%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "SchedulerType=sched/backfill"
  echo "SlurmdParameters=config_overrides"
  echo "ReturnToService=2"
  echo "MpiDefault=none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "InactiveLimit=0"
  echo "KillWait=10"
  echo "MinJobAge=60"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=10"
  for i in $(seq "$nodes"); do
    echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=carls Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$dir/slurm.conf"
cat > "$dir/env" <<EOF
# . this file: Slurm's commands then talk to the cluster in $dir
export SLURM_CONF=$dir/slurm.conf
EOF

fail() {
  echo "$0: $1 did not start; its log:" >&2
  tail -n 30 "$2" >&2 || true
  "$(dirname "$0")/down.sh" "$dir" >/dev/null 2>&1 || true
  exit 1
}
export SLURM_CONF=$dir/slurm.conf
slurmctld -c -f "$dir/slurm.conf" || fail slurmctld "$dir/slurmctld.log"
for i in $(seq "$nodes"); do
  mkdir -p "$dir/slurmd.n$i"
  slurmd -f "$dir/slurm.conf" -N "n$i" || fail "slurmd n$i" "$dir/slurmd.n$i.log"
done

# Wait until every node is idle (the daemons register within seconds; 60 s at most).
for _ in $(seq 600); do
  idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
  [ "$idle" -ge "$nodes" ] && break
  sleep 0.1
done
if [ "${idle:-0}" -lt "$nodes" ]; then
  sinfo -N >&2 || true
  fail "the cluster (not every node idle after 60 s)" "$dir/slurmctld.log"
fi
echo "slurm: $nodes nodes idle ($cpus CPUs each), controller on port $base; . $dir/env to use it"
