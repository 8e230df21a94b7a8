#!/usr/bin/env bash
# Tears down a cluster that scripts/slurm/up.sh brought up in DIR: cancels its jobs, then stops every slurmd,
# slurmctld and munged by the pids in DIR's pid files (SIGTERM, SIGKILL after 10 s), and nothing else.
# DIR itself (logs, configuration) is left for reading; rm -rf it when done.
# Usage: scripts/slurm/down.sh DIR
set -uo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
case "$1" in -h|--help) sed -n '2,5p' "$0"; exit 0 ;; esac
dir=$1
[ -f "$dir/slurm.conf" ] || { echo "$0: $dir/slurm.conf not found: not a cluster made by up.sh" >&2; exit 2; }
export SLURM_CONF=$dir/slurm.conf

if [ -f "$dir/slurmctld.pid" ]; then
  scancel --full --quiet --user=root 2>/dev/null || true
  # Give slurmd the time to end the jobs' processes (KillWait) while the controller still runs.
  for _ in $(seq 100); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.1
  done
fi

# Stops the process whose pid is in file $1 (when it is still that daemon, named $2).
stop() {
  local file=$1 name=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null || true)
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if [ -r "/proc/$pid/comm" ] && grep -q "$name" "/proc/$pid/comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

for f in "$dir"/slurmd.*.pid; do
  [ -e "$f" ] && stop "$f" slurmd
done
stop "$dir/slurmctld.pid" slurmctld
stop "$dir/munge/munged.pid" munged
echo "slurm: cluster in $dir stopped"
