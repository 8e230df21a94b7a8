# What the Slurm tests (test_slurm.sh, test_slurm_replicas.sh) share, sourced after `set -uo pipefail` with
# $src set to the source directory: slurm_cluster_up NAME NODES CPUS skips (exit 77) without slurm-wlm/munge,
# root or dataset-fashion-mnist, makes $tmp (/tmp/carls-NAME.XXXXXX), brings a throwaway cluster up in
# $tmp/cluster (scripts/slurm/up.sh; slurm_cluster_down, also on exit), sources its env and enters $tmp;
# fail MESSAGE counts a failure in $fails; slurm_test_finish NAME [TEXT] stops the cluster first (its files
# go with $tmp, and down.sh needs them), then ends the test: with failures exit 1 keeping $tmp, else removes
# it and prints "NAME: OK TEXT"; small_graphreg_ini prints the settings of the small graphreg
# experiment both tests run (each adds its name, steps, cadence and bank).
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

slurm_cluster_down() { "$src/scripts/slurm/down.sh" "$tmp/cluster" >/dev/null 2>&1; }

slurm_cluster_up() {
  local name=$1 nodes=$2 cpus=$3 prog
  for prog in munged slurmctld slurmd srun salloc sinfo squeue scancel scontrol; do
    command -v "$prog" >/dev/null || { echo "SKIPPED: $prog is not installed (slurm-wlm and munge: scripts/setup.sh)"; exit 77; }
  done
  [ "$(id -u)" -eq 0 ] || { echo "SKIPPED: a local Slurm cluster needs root (slurmd)"; exit 77; }
  [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    { echo "SKIPPED: dataset-fashion-mnist is not installed"; exit 77; }
  tmp=$(mktemp -d "/tmp/carls-$name.XXXXXX")
  trap slurm_cluster_down EXIT
  "$src/scripts/slurm/up.sh" "$tmp/cluster" "$nodes" "$cpus" || { echo "FAIL: the cluster did not come up"; exit 1; }
  . "$tmp/cluster/env"
  cd "$tmp"
}

slurm_test_finish() {
  trap - EXIT
  slurm_cluster_down
  if [ "$fails" -ne 0 ]; then
    echo "$1: $fails failure(s); files in $tmp"
    exit 1
  fi
  cd /
  rm -rf "$tmp"
  echo "$1: OK${2:+ $2}"
  exit 0
}

small_graphreg_ini() {
  cat <<'INI'
runs_dir = runs
items = 1000
labels_per_class = 10
makers = 2
maker_device = cpu
graph_k = 5
label_maker = 1
label_model_weight = 0
hidden = 64,32
batch_labelled = 100
batch_unlabelled = 64
alpha = 0.1
neighbors = 5
neighbors_from = bank
beta = 1
trainer_device = cpu
INI
}
