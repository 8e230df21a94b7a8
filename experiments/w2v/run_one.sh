#!/usr/bin/env bash
# One word2vec configuration on the KJV through a fresh kb-server, scored on a pairs file: the loop used to
# choose word2vec's defaults (docs/EXPERIMENTS.md "Word2vec defaults"). fastText runs the same way with
# NAME starting "fasttext" and fastText's own flags.
#
# Usage: experiments/w2v/run_one.sh OUT_DIR NAME PAIRS_FILE [trainer word2vec flags... | fasttext flags...]
#   OUT_DIR/kjv.tok is made once (trainer word2vec --tokenize-only); OUT_DIR/results.tsv gets one line:
#   name, load before, wall seconds, CPU seconds (all processes), the w2v-eval lines, the flags.
# Environment: BUILD (default build), PORT (default 7650).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD:-$root/build}"
[ $# -ge 3 ] || { sed -n 2,11p "$0"; exit 2; }
out="$1" name="$2" pairs="$3"
shift 3
T="$build/bin/trainer" S="$build/bin/kb-server"
mkdir -p "$out"
tok="$out/kjv.tok"
[ -s "$tok" ] || "$T" word2vec --corpus kjv --tokenize-only > "$tok"
load=$(cut -d' ' -f1 /proc/loadavg)
t0=$(date +%s.%N)
c0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
if [[ "$name" == fasttext* ]]; then
  fasttext skipgram -input "$tok" -output "$out/$name" "$@" > "$out/$name.log" 2>&1
else
  port="${PORT:-7650}"
  data="$out/$name.kb"; rm -rf "$data"
  "$S" --listen "tcp://127.0.0.1:$port" --data "$data" --durability interval:1000 --threads 2 \
    > "$out/$name.server.log" 2>&1 &
  spid=$!
  "$T" word2vec --corpus "$tok" --kb "tcp://127.0.0.1:$port" --table w "$@" --export "$out/$name.vec" \
    --log-level warn > "$out/$name.log" 2>&1 || { kill "$spid"; wait "$spid" || true; echo "$name failed:"; tail "$out/$name.log"; exit 1; }
  kill "$spid"; wait "$spid" || true
  rm -rf "$data"
fi
t1=$(date +%s.%N)
cpu=$(awk -v c0="$c0" '{printf "%.1f", ($14 + $15 + $16 + $17 - c0) / 100}' /proc/$$/stat)
q=$("$T" w2v-eval --vectors "$out/$name.vec" --pairs "$pairs" | grep '^pairs' | tr '\n' ' ')
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$load" "$wall" "$cpu" "$q" "$*" | tee -a "$out/results.tsv"
