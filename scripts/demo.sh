#!/usr/bin/env bash
# The main job, for now: installs what is missing, builds, starts a kb-server on loopback and runs a short
# kbctl session that shows the lazy-averaged update (CARLS §3.2): two trainers push gradients for the same
# key, the server caches them, and the next lookup applies their average in ONE optimizer step.
# Usage: scripts/demo.sh            (from anywhere; builds into build/)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

work=$(mktemp -d /tmp/carls-demo-XXXXXX)
build/bin/kb-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/endpoint" --data "$work/data" \
  --durability sync 2>"$work/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/endpoint" ] && break; sleep 0.05; done
export CARLS_KB=$(cat "$work/endpoint")
kbctl=build/bin/kbctl
step() { printf '\n$ %s\n' "$*"; }

echo "kb-server listening on $CARLS_KB (data in $work/data)"
step kbctl create-table words --dim 2 --optimizer sgd --lr 0.5 --update lazy --max-age-ms 60000 --init zeros
$kbctl create-table words --dim 2 --optimizer sgd --lr 0.5 --update lazy --max-age-ms 60000 --init zeros
step "printf 'sheep\t1 1\n' | kbctl put words"
printf 'sheep\t1 1\n' | $kbctl put words
step "printf 'sheep\t2 0\n' | kbctl push-grad words      # trainer A"
printf 'sheep\t2 0\n' | $kbctl push-grad words
step "printf 'sheep\t4 -2\n' | kbctl push-grad words     # trainer B"
printf 'sheep\t4 -2\n' | $kbctl push-grad words
step "kbctl stats words    # two gradients wait for the key's next lookup"
$kbctl stats words | grep -E 'pending|updates_applied'
step "kbctl get words sheep   # 1 - 0.5*mean(2,4) = -0.5 ; 1 - 0.5*mean(0,-2) = 1.5"
$kbctl get words sheep
step "kbctl stats words"
$kbctl stats words | grep -E 'pending|updates_applied|gradients_applied'

step kbctl create-table words_immediate --dim 2 --optimizer sgd --lr 0.5 --update immediate --init zeros
$kbctl create-table words_immediate --dim 2 --optimizer sgd --lr 0.5 --update immediate --init zeros
printf 'sheep\t1 1\n' | $kbctl put words_immediate
printf 'sheep\t2 0\nsheep\t4 -2\n' | $kbctl push-grad words_immediate
step "kbctl get words_immediate sheep   # immediate policy: two steps, 1 - 0.5*(2+4) = -2 ; 1 - 0.5*(0-2) = 2"
$kbctl get words_immediate sheep

step "kbctl get words lamb --meta   # an unseen key: its initial value, created on first sight"
$kbctl get words lamb --meta
step kbctl list-tables
$kbctl list-tables

# The main experiment, quick version (CARLS Figure 2: bank, maker fleets, trainer; under 10 minutes on 2 cores):
# the last line is the result, runs/graphreg-quick/ holds report.md, metrics.csv and the plots.
step "build/bin/carls run experiments/graphreg-quick.ini"
build/bin/carls run experiments/graphreg-quick.ini
