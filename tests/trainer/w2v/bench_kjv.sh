#!/usr/bin/env bash
# Word2vec on the KJV through the knowledge bank, side by side with Debian's fastText in the same run
# (docs/BENCHMARKS.md "Word2vec", docs/EXPERIMENTS.md "Word2vec (DynamicEmbedding)").
#
# Usage: tests/trainer/w2v/bench_kjv.sh [BUILD_DIR] [OUT_DIR] [CONFIG...]
#   CONFIG names one run each (default: all, in this order):
#     fasttext2 fasttext1        fastText skipgram with 2 / 1 threads (compared with fasttext2: its own
#                                run-to-run neighbour overlap)
#     w1                         1 trainer (defaults, lazy updates)
#     w2 w4                      2 / 4 trainers (--worker i/n), lazy updates
#     w2imm w4imm                2 / 4 trainers, immediate updates
#     w<N>[imm]b<B>              N trainers with B tokens per batch and a pool of B/2 (e.g. w4b2048: the
#                                same tokens per round of 4 batches as one trainer's default batch)
# Every run gets a fresh kb-server (--durability interval:1000, 2 worker threads) on its own port and data
# directory. Each line of OUT_DIR/results.tsv: config, load average before, wall seconds, words/s (corpus
# tokens x epochs / wall), mean share of trainer time waiting on the bank, CPU seconds (fastText; or the
# trainers' + the bank's), quality checks (w2v-eval).
# Settings shared by both programs: dim 100, window 5, negatives 5, epochs 15, min count 5; subsampling at
# each program's default (trainer 1e-3, fastText -t 1e-4), the trainer's other settings at its defaults.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/out/w2v-bench}"
shift $(( $# > 2 ? 2 : $# )) || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(fasttext2 fasttext1 w1 w2 w4 w2imm w4imm)
T="$build/bin/trainer"
S="$build/bin/kb-server"
mkdir -p "$out"
tok="$out/kjv.tok"
[ -s "$tok" ] || "$T" word2vec --corpus kjv --tokenize-only > "$tok"
words=$(wc -w < "$tok")
epochs=15
pairs="$root/tests/trainer/w2v/kjv_similarity.txt"
cats="$root/tests/trainer/w2v/kjv_categories.txt"
results="$out/results.tsv"
[ -s "$results" ] || printf 'config\tload\twall_s\twords_per_s\tbank_wait\tcpu_s\tquality\n' > "$results"
export TIMEFORMAT='%U %S'
cpu_of() { awk '{s += $1 + $2} END {printf "%.1f", s}' "$@"; } # sums "user sys" lines

quality() { # vectors -> one line of w2v-eval numbers
  local ref=()
  [ -s "$out/fasttext2.vec" ] && [ "$1" != "$out/fasttext2.vec" ] && ref=(--compare "$out/fasttext2.vec")
  "$T" w2v-eval --vectors "$1" --pairs "$pairs" --categories "$cats" "${ref[@]}" |
    awk '/^pairs/ {printf "spearman=%s median_rank=%s hit10=%s ", $3, $4, $5}
         /^categories/ {printf "%s %s %s ", $3, $4, $5}
         /^overlap/ {printf "ft_overlap@10=%s", $NF}' | sed 's/spearman=spearman=/spearman=/; s/median_rank=related_median_rank=/median_rank=/; s/hit10=related_hit@10=/hit10=/'
}

port=7600
for cfg in "${configs[@]}"; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  case "$cfg" in
    fasttext1|fasttext2)
      th=${cfg#fasttext}
      t0=$(date +%s.%N)
      { time fasttext skipgram -input "$tok" -output "$out/$cfg" -dim 100 -ws 5 -neg 5 -epoch $epochs \
          -minCount 5 -maxn 0 -t 1e-4 -thread "$th" > "$out/$cfg.log" 2>&1; } 2> "$out/$cfg.cpu"
      t1=$(date +%s.%N)
      wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
      printf '%s\t%s\t%.1f\t%.0f\t-\t%s\t%s\n' "$cfg" "$load" "$wall" \
        "$(awk -v w="$words" -v e="$epochs" -v t="$wall" 'BEGIN {print w * e / t}')" "$(cpu_of "$out/$cfg.cpu")" \
        "$(quality "$out/$cfg.vec")" | tee -a "$results"
      ;;
    w*)
      # w<N>[imm][b<B>]: N trainers, immediate updates, B tokens per batch (pool B/2)
      n=$(echo "$cfg" | sed 's/^w\([0-9]*\).*/\1/')
      update=lazy; [[ "$cfg" == *imm* ]] && update=immediate
      extra=()
      if [[ "$cfg" =~ b([0-9]+)$ ]]; then
        extra=(--batch-tokens "${BASH_REMATCH[1]}" --pool $((BASH_REMATCH[1] / 2)))
      fi
      port=$((port + 1))
      data="$out/$cfg.kb"; rm -rf "$data"
      "$S" --listen "tcp://127.0.0.1:$port" --data "$data" --durability interval:1000 --threads 2 \
        > "$out/$cfg.server.log" 2>&1 &
      spid=$!
      sleep 1
      t0=$(date +%s.%N)
      pids=()
      for ((i = 0; i < n; i++)); do
        { time "$T" word2vec --corpus kjv --kb "tcp://127.0.0.1:$port" --table kjv --update "$update" \
            --worker "$i/$n" "${extra[@]}" > "$out/$cfg.$i.out" 2> "$out/$cfg.$i.err"; } 2> "$out/$cfg.$i.cpu" &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; done
      t1=$(date +%s.%N)
      wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
      "$T" word2vec --kb "tcp://127.0.0.1:$port" --table kjv --epochs 0 --export "$out/$cfg.vec" \
        --predict sheep,gold,king,water,sword,bread,lord,city > "$out/$cfg.predict" 2> /dev/null
      server_cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' /proc/$spid/stat)
      kill "$spid"; wait "$spid" || true
      wait_share=$(cat "$out"/$cfg.*.out | sed -n 's/.*bank_wait_share=\([0-9.]*\).*/\1/p' |
        awk '{s += $1; n++} END {printf "%.3f", n ? s / n : 0}')
      # cpu_s: the trainers' user+sys seconds + the bank's (its whole life, table creation to export)
      printf '%s\t%s\t%.1f\t%.0f\t%s\t%s+%s\t%s\n' "$cfg" "$load" "$wall" \
        "$(awk -v w="$words" -v e="$epochs" -v t="$wall" 'BEGIN {print w * e / t}')" "$wait_share" \
        "$(cpu_of "$out"/$cfg.*.cpu)" "$server_cpu" "$(quality "$out/$cfg.vec")" | tee -a "$results"
      ;;
    *) echo "bench_kjv: unknown config $cfg" >&2; exit 2 ;;
  esac
done
