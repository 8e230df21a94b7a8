#!/bin/sh
# Runs experiments/graphreg.ini once per label seed and appends one line per run to a TSV (docs/EXPERIMENTS.md).
#   experiments/graphreg_seeds.sh OUT.tsv NAME "SEEDS" [--set key=value]...
# e.g. experiments/graphreg_seeds.sh results.tsv dyn "0 1 2" --set graph_refresh=2
# Each run is build/bin/carls run experiments/graphreg.ini --set label_seed=S --set name=NAME-sS plus the sets;
# the TSV gets: name, label seed, the accuracy the run ends with (test_accuracy, or val_accuracy with
# validation > 0), the run's wall seconds, and the sets. Runs go one after the other; a failed run is a line
# with accuracy "failed" and the script carries on.
set -u
if [ $# -lt 3 ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1 name=$2 seeds=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
for s in $seeds; do
    log=$(mktemp)
    if "$here/build/bin/carls" run "$here/experiments/graphreg.ini" --set label_seed="$s" --set name="$name-s$s" "$@" >"$log" 2>&1; then
        acc=$(tail -n 1 "$log" | tr ' ' '\n' | sed -n 's/^\(test\|val\)_accuracy=//p')
        wall=$(tail -n 1 "$log" | tr ' ' '\n' | sed -n 's/^wall_s=//p')
    else
        acc=failed wall=
        tail -n 5 "$log" >&2
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$s" "${acc:-failed}" "$wall" "$*" >>"$out"
    printf '%s seed %s: %s (%s s)\n' "$name" "$s" "${acc:-failed}" "$wall"
    rm -f "$log"
done
