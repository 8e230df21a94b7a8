#!/usr/bin/env bash
# `carls run --slurm` on a real Slurm cluster brought up on this machine (scripts/slurm/up.sh: munged,
# slurmctld, two slurmd, n1 and n2): a small graphreg experiment must finish with the same result line and
# report as a local run, its kb-server, makers and trainer must have run as job steps on both nodes
# (steps.tsv, and each log's "carls-step JOB.STEP on NODE" line written by the step itself from Slurm's
# variables), the trainer's checkpoints must have reached n2's own directory (the makers' copy, moved by the
# launcher through srun); the same command in an sbatch script must finish inside that job; and scancel of a
# third run's job must stop the launcher (exit 130) and leave no process of the runs behind. Skips (77) only when slurm-wlm/munge are not installed, when not root (slurmd
# must be), or without dataset-fashion-mnist.
# Usage: test_slurm.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1
src=$2
. "$(dirname "$0")/slurm_testlib.sh"
slurm_cluster_up slurm-test 2 4
sinfo -N
{
  echo "# small end-to-end configuration (as test_launcher_short's)"
  small_graphreg_ini
  cat <<'INI'
name = e2e
steps = 150
ckpt_every = 25
eval_every = 50
timeout_s = 300
INI
} > e2e.ini
scratch=$tmp/scratch

# Processes of this test's runs still alive: their command lines name the scratch directory.
run_procs() {
  local p line
  for p in /proc/[0-9]*; do
    line=$({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null) || continue
    case "$line" in *"$scratch"*) echo "${p#/proc/}: $line" ;; esac
  done
  return 0
}
# Waits (60 s at most) until no process of the runs is left and the cluster has no job.
wait_clean() {
  for _ in $(seq 600); do
    [ -z "$(run_procs)" ] && [ -z "$(squeue -h -o %i)" ] && return 0
    sleep 0.1
  done
  return 1
}

# 1. A whole run, the allocation asked for by carls run itself (salloc).
"$bin/carls" run --slurm e2e.ini --slurm-scratch "$scratch" > run.log 2>&1
st=$?
cat run.log | grep -v '^\[maker' | tail -n 25
[ $st -eq 0 ] || fail "carls run --slurm exited with $st"
last=$(grep -v '^salloc:' run.log | tail -n 1)
case "$last" in test_accuracy=*) ;; *) fail "the last line is not the result: $last" ;; esac
grep -q 'test_accuracy' runs/e2e/report.md || fail "report.md lacks the result"
grep -q '^150,' runs/e2e/metrics.csv || fail "metrics.csv (copied back from the trainer's node) lacks step 150"
[ -f runs/e2e/ckpt/latest ] || fail "the trainer's checkpoints did not come back to the launcher's node"
echo "--- steps.tsv"; cat runs/e2e/steps.tsv
nodes=$(cut -f2 runs/e2e/steps.tsv | sort -u | tr '\n' ' ')
[ "$(cut -f2 runs/e2e/steps.tsv | sort -u | wc -l)" -ge 2 ] || fail "the steps ran on fewer than 2 nodes: $nodes"
awk -F'\t' '$1 == "kb-server 0/1" && $2 == "n1"' runs/e2e/steps.tsv | grep -q . || fail "kb-server not a step on n1"
awk -F'\t' '$1 == "trainer" && $2 == "n1"' runs/e2e/steps.tsv | grep -q . || fail "trainer not a step on n1"
awk -F'\t' '$1 == "maker embed 0/2" && $2 == "n2"' runs/e2e/steps.tsv | grep -q . || fail "embed maker not a step on n2"
# What the steps themselves saw (SLURM_JOB_ID.SLURM_STEP_ID, SLURMD_NODENAME), in the logs that came back.
grep -h '^carls-step ' runs/e2e/logs/*.log | sort -u
grep -q '^carls-step [0-9]*\.[0-9]* on n1: .*kb-server' runs/e2e/logs/kb-server-0.log || fail "kb-server's log has no step line from n1"
grep -q '^carls-step [0-9]*\.[0-9]* on n2: .*kb-maker' runs/e2e/logs/maker-embed-0.log || fail "the embed maker's log has no step line from n2"
ls "$scratch"/carls-*-e2e/n2/ckpt/latest >/dev/null 2>&1 || fail "no checkpoint reached n2's own directory"
grep -q 'ended with status' run.log && fail "a process did not stop cleanly"
wait_clean || { fail "processes or jobs left after the run:"; run_procs; squeue; }

# 2. Inside an allocation made by someone else: an sbatch script calling carls run --slurm.
cat > job.sh <<JOB
#!/bin/bash
#SBATCH --nodes=2 --exclusive --job-name=carls-batch --output=$tmp/batch.out
cd $tmp
"$bin/carls" run --slurm e2e.ini --slurm-scratch "$scratch" --set name=e2e-batch --set steps=50
echo "carls exit \$?"
JOB
sbatch --wait job.sh >/dev/null
grep -v '^\[maker' batch.out | tail -n 4
grep -q '^carls exit 0$' batch.out || fail "carls run --slurm inside an sbatch job did not exit 0"
grep -q '^test_accuracy=' batch.out || fail "no result line from the sbatch run"
grep -q "^trainer	n1	" runs/e2e-batch/steps.tsv || fail "the sbatch run's trainer was not a step on n1"
wait_clean || { fail "processes or jobs left after the sbatch run:"; run_procs; squeue; }

# 3. scancel of the job while the trainer runs: the launcher stops everything and exits 130.
"$bin/carls" run --slurm e2e.ini --slurm-scratch "$scratch" --set steps=10000000 --set name=e2e-cancel > cancel.log 2>&1 &
pid=$!
for _ in $(seq 1200); do
  grep -q '^\[trainer\]' cancel.log && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
grep -q '^\[trainer\]' cancel.log || fail "the trainer never reported in the run to cancel"
job=$(squeue -h -n carls-e2e -o %i | head -n 1)
echo "--- scancel $job"
squeue -s
[ -n "$job" ] && scancel "$job"
wait $pid
st=$?
tail -n 12 cancel.log
[ $st -eq 130 ] || fail "after scancel, carls exited with $st (want 130)"
grep -q 'every process stopped' cancel.log || fail "no clean stop reported after scancel"
wait_clean || { fail "processes or jobs left after scancel:"; run_procs; squeue; }

slurm_test_finish test_slurm
