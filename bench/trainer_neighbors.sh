#!/bin/bash
# Trainer steps/s against the number of neighbours K, bank mode vs in-trainer mode (docs/BENCHMARKS.md,
# "Trainer steps/s against the number of neighbours"). Usage: bench/trainer_neighbors.sh [WORKDIR]; needs build/bin.
# NBR_REFRESH=N (default 20, the trainer's default) is passed to bank mode as --neighbor-refresh N.
# REPS=R (default 3): each (mode, K) runs R times, the rounds interleaved (every K once per round) so that load
# which drifts during the measurement hits every K alike; the median of the R runs is reported.
set -u
cd "$(dirname "$0")/.."
REFRESH=${NBR_REFRESH:-20}
REPS=${REPS:-3}
B=build/bin; D=${1:-/tmp/carls-bench-neighbors}; rm -rf $D; mkdir -p $D
$B/kb-server --listen 'tcp://127.0.0.1:*' --endpoint-file $D/ep --data $D/kb --durability interval:1000 > $D/kb.log 2>&1 &
SP=$!
for i in $(seq 50); do [ -s $D/ep ] && break; sleep 0.1; done
EP=$(cat $D/ep)
$B/kb-maker --kb $EP --task embed --encoder pixels --items 10000 --once > $D/mk.log 2>&1
$B/kb-maker --kb $EP --task graph --source pixels --k 50 --items 10000 --once >> $D/mk.log 2>&1
# a checkpoint, then one embed pass so the bank holds every item's embedding
$B/trainer graphreg --data fashion-mnist --kb $EP --train-items 10000 --alpha 0 --steps 10 --ckpt-dir $D/ckpt --ckpt-every 10 --eval-every 100000 > $D/t0.log 2>&1
$B/kb-maker --kb $EP --task embed --items 10000 --ckpt-dir $D/ckpt --once >> $D/mk.log 2>&1
echo "load_before $(cut -d' ' -f1 /proc/loadavg)"
CASES="bank:1 bank:5 bank:10 bank:20 bank:50 trainer:1 trainer:5 trainer:10"
for r in $(seq $REPS); do
  for c in $CASES; do
    mode=${c%%:*}; K=${c##*:}
    extra=""; [ $mode = bank ] && extra="--neighbor-refresh $REFRESH"
    out=$($B/trainer graphreg --data fashion-mnist --kb $EP --train-items 10000 --alpha 0.1 --neighbors $K \
        --neighbors-from $mode $extra --steps 2000 --eval-every 100000 --ckpt-every 100000 --ckpt-dir $D/ckpt-run 2>&1)
    sps=$(echo "$out" | tr ' ' '\n' | grep '^steps_per_s=' | tail -1 | cut -d= -f2)
    wait=$(echo "$out" | tr ' ' '\n' | grep '^wait_ms_per_step=' | cut -d= -f2)
    rows=$(echo "$out" | tr ' ' '\n' | grep '^neighbor_rows_read_per_step=' | cut -d= -f2)
    echo "round=$r $mode K=$K steps_per_s=$sps wait_ms_per_step=$wait rows_read_per_step=${rows:--} load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a $D/runs.txt
  done
done
echo "median over $REPS rounds:"
for c in $CASES; do
  mode=${c%%:*}; K=${c##*:}
  med=$(grep " $mode K=$K " $D/runs.txt | sed 's/.*steps_per_s=\([0-9.]*\).*/\1/' | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
  echo "$mode K=$K median_steps_per_s=$med"
done
kill $SP; wait $SP
