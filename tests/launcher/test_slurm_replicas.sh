#!/usr/bin/env bash
# A node lost under `carls run --slurm` with a replicated bank (issue 37, docs/REPLICATION.md section 6): on a
# two-node throwaway cluster (scripts/slurm/up.sh: n1, n2), a small graphreg run with shards = 2, replicas = 2
# and kb_durability = sync places shard I's member M on node (I + M) mod 2, so n2 holds shard 1's primary,
# shard 0's follower and the embed makers. Once the trainer is 10% in, n2 is killed: its slurmd, every process
# of the run's steps on it (slurmstepd and what it started, from steps.tsv) and its scratch directory (the
# node's local disk). Then:
#   - the launcher finds n2 lost (sinfo marks it not responding within SlurmdTimeout, 10 s in up.sh), promotes
#     shard 1's follower on n1, restarts the lost members and makers on n1 (steps.tsv), and the run finishes:
#     exit 0, a result line with test_accuracy above 0.4 (chance 0.1; this configuration ends near 0.65 with
#     or without the loss) and bank_failovers >= 1;
#   - replication.tsv records the promotion of shard 1's member 1 in term 3.
# Skips (77) only without slurm-wlm/munge, root or dataset-fashion-mnist.
# Usage: test_slurm_replicas.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
. "$(dirname "$0")/slurm_testlib.sh"
slurm_cluster_up slurm-replicas 2 8
steps=12000
{
  echo "# small graphreg run (as test_launcher_replicas's) on a replicated, sharded bank"
  small_graphreg_ini
  cat <<INI
name = rep
steps = $steps
ckpt_every = 100
eval_every = 2000
timeout_s = 500
shards = 2
replicas = 2
kb_durability = sync
kb_threads = 1
maker_bank_timeout_ms = 1000
INI
} > rep.ini
scratch=$tmp/scratch

# Kills pid and everything under it, children first.
kill_tree() {
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill -9 "$1" 2>/dev/null
}

"$bin/carls" run --slurm rep.ini --slurm-scratch "$scratch" > run.log 2>&1 &
launcher=$!
for _ in $(seq 1800); do
  step=$(sed -n 's/.*ckpt-\([0-9]*\)\.ckpt.*/\1/p' runs/rep/ckpt/latest 2>/dev/null) # "ckpt-000000001200.ckpt"
  [ -n "$step" ] && step=$((10#$step)) && [ "$step" -ge $((steps / 10)) ] && break
  kill -0 $launcher 2>/dev/null || break
  sleep 0.1
done
echo "--- steps.tsv when n2 is killed (trainer checkpoint ${step:-none})"
cat runs/rep/steps.tsv
if ! { [ -n "$step" ] && [ "$step" -ge $((steps / 10)) ] && [ "$step" -lt "$steps" ] && kill -0 $launcher; }; then
  fail "the trainer was not between 10% and the end when n2 was to be killed (step ${step:-none})"
  tail -n 30 run.log
  kill $launcher 2>/dev/null; wait $launcher
  echo "test_slurm_replicas: files in $tmp"
  exit 1
fi

# n2 goes: its slurmd, the run's steps there with all they started, its local disk.
kill -9 "$(cat cluster/slurmd.n2.pid)"
killed=0
for id in $(awk -F'\t' '$2 == "n2" {print $3}' runs/rep/steps.tsv); do
  for p in $(pgrep -f "slurmstepd: \[$id\]"); do kill_tree "$p"; killed=$((killed + 1)); done
done
rm -rf "$scratch"/carls-*-rep/n2
echo "--- killed n2: slurmd and $killed step daemon(s) with their processes, at $(date +%T)"
[ "$killed" -ge 2 ] || fail "fewer than 2 of the run's steps were found on n2 ($killed)"

wait $launcher
st=$?
grep -v '^\[maker\|^\[trainer\]' run.log | tail -n 30
[ $st -eq 0 ] || fail "carls run --slurm exited with $st after n2 was lost"
last=$(grep -v '^salloc:' run.log | tail -n 1)
case "$last" in test_accuracy=*) ;; *) fail "the last line is not the result: $last" ;; esac
acc=$(echo "$last" | sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p')
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.4) }' || fail "test_accuracy ${acc:-none} is not above 0.4"
failovers=$(echo "$last" | sed -n 's/.* bank_failovers=\([0-9]*\) .*/\1/p')
[ "${failovers:-0}" -ge 1 ] || fail "no failover in the result line: $last"
grep -q 'node n2 stopped responding (sinfo)' runs/rep/logs/*.log || fail "the launcher's steps never said n2 was lost (their logs)"
grep -q 'kb-server 1/2 member 1 promoted to primary (term 3,' run.log || fail "shard 1's follower was not promoted"
awk -F'\t' '$2 == 1 && $3 == 3 && $4 == 1' runs/rep/replication.tsv | grep -q . ||
  fail "replication.tsv lacks shard 1's term 3 with member 1"
echo "--- steps.tsv at the end"
cat runs/rep/steps.tsv
awk -F'\t' '$1 == "kb-server 1/2 member 0" && $2 == "n1"' runs/rep/steps.tsv | grep -q . ||
  fail "shard 1's old primary was not restarted on n1"
awk -F'\t' '$1 ~ /^maker embed/ && $2 == "n1"' runs/rep/steps.tsv | grep -q . ||
  fail "no embed maker was restarted on n1"

slurm_test_finish test_slurm_replicas "($last)"
