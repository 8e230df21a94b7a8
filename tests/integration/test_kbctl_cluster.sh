#!/usr/bin/env bash
# Integration: kbctl's retrieval, feature, export/import verbs against real kb-servers, on a 2-shard bank
# (kb-server --shard 0/2 and 1/2, kbctl --kb A,B) and on a single server; CURVE flags when the build has
# kb-keygen. Exact text output and exit codes.
# Usage: test_kbctl_cluster.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: test_kbctl_cluster.sh BIN_DIR}
work=$(mktemp -d /tmp/carls-kbctl-cluster-XXXXXX)
pids=()
failures=0
passes=0

# start_server NAME [kb-server args...]: starts one server with its own data dir; its endpoint in $work/NAME.ep
start_server() {
  local name=$1
  shift
  rm -f "$work/$name.ep"
  "$bin/kb-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/$name.ep" --data "$work/$name.data" "$@" \
    2>>"$work/$name.log" &
  pids+=($!)
  for _ in $(seq 200); do [ -s "$work/$name.ep" ] && break; sleep 0.05; done
  [ -s "$work/$name.ep" ] || { echo "server $name did not start"; cat "$work/$name.log"; exit 1; }
}
cleanup() {
  # TERM: the servers shut down cleanly; waiting here keeps bash from reporting each job's end.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; { wait "$p"; } 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

check() { # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then passes=$((passes + 1)); else
    failures=$((failures + 1)); printf 'FAIL %s\n  expected: %q\n  actual:   %q\n' "$1" "$2" "$3"; fi
}
status_of() { "$@" >/dev/null 2>&1; echo $?; }

start_server s0 --shard 0/2
start_server s1 --shard 1/2
start_server one
two="$(cat "$work/s0.ep"),$(cat "$work/s1.ep")"
one=$(cat "$work/one.ep")
k=$bin/kbctl
export CARLS_KB=$two

# ---- embeddings and nearest neighbours on two shards ----
check "create knn table" 0 "$(status_of $k create-table emb --dim 2 --knn Flat --metric l2 --init zeros)"
printf 'a\t1 0\nb\t0 1\nc\t1 1\nd\t5 5\ne\t-1 0\nf\t0.5 0.25\n' | $k put emb --version 4 2>/dev/null
check "get through two shards" $'a\t1 0\nd\t5 5\nf\t0.5 0.25' "$($k get emb a d f)"
check "list sums rows over shards" $'emb\t2\t6\tsgd\tlazy' "$($k list-tables)"
# Both shards hold some of the rows.
check "rows split" "yes" "$(r0=$($k --kb "$(cat "$work/s0.ep")" stats emb | grep '^rows:'); \
  r1=$($k --kb "$(cat "$work/s1.ep")" stats emb | grep '^rows:'); [ "$r0" != "rows: 0" ] && [ "$r1" != "rows: 0" ] && echo yes)"
check "knn by vector (l2, nearest first)" $'a\t0.0625\nf\t0.125\nc\t1.0625' "$($k knn emb --k 3 --vector '0.75 0')"
check "knn by key" $'a\t0\nf\t0.3125\nc\t1' "$($k knn emb --k 3 --key a)"
check "knn by key, excluding itself" $'f\t0.3125\nc\t1\nb\t2' "$($k knn emb --k 3 --key a --exclude-self)"
check "knn k above rows" 6 "$($k knn emb --k 100 --vector '0 0' | wc -l)"
check "knn needs key or vector" 1 "$(status_of $k knn emb --k 3)"
check "knn vector of the wrong dim" 1 "$(status_of $k knn emb --vector '1 2 3')"
check "knn on a table without index" 2 "$(create=$($k create-table plain --dim 2 2>&1); status_of $k knn plain --vector '1 2')"

# ---- sampling ----
out=$($k sample emb --n 5 --seed 11 b e)
check "sample lines" 7 "$(echo "$out" | wc -l)"
check "sample positives first" $'b\tpositive\ne\tpositive' "$(echo "$out" | head -2 | cut -f1,3)"
check "sample candidates" 5 "$(echo "$out" | tail -n +3 | grep -c $'\tsampled$')"
check "sample uniform probability" "0.166667" "$(echo "$out" | head -1 | cut -f2 | xargs printf '%g')"
check "sample seeded repeats" "$out" "$($k sample emb --n 5 --seed 11 b e)"
check "sample probabilities of every row sum to 1" "1.0000" \
  "$($k sample emb --n 0 --strategy unigram a b c d e f | awk -F'\t' '{s += $2} END {printf "%.4f", s}')"
check "sample needs --n" 1 "$(status_of $k sample emb)"
check "sample unknown strategy" 1 "$(status_of $k sample emb --n 3 --strategy zipf)"

# ---- feature records ----
check "create feature table" 0 "$(status_of $k create-table graph --kind feature)"
check "feature table takes no dim" 1 "$(status_of $k create-table graph2 --kind feature --dim 3)"
lines=$'n%201\tlabel=3 confidence=0.9 version=2 neighbors=a:0.5,b%2Cx:0.25 data=00ff\nn2\tflabel=1.5\nn3\t'
check "put-feature" 0 "$(printf '%s\n' "$lines" | status_of $k put-feature graph)"
check "get-feature prints the same lines" "$lines"$'\nnope\tfound=false' "$($k get-feature graph 'n 1' n2 n3 nope)"
check "get-feature --meta" 1 "$($k get-feature graph n2 --meta | grep -c 'flabel=1.5 updated_at_ms=[1-9]')"
$k create-table graph_copy --kind feature 2>/dev/null
$k get-feature graph 'n 1' n2 n3 nope | $k put-feature graph_copy 2>/dev/null
check "piped back into put-feature" "$lines"$'\nnope\tfound=false' "$($k get-feature graph_copy 'n 1' n2 n3 nope)"
err=$(printf 'x\tlabel=1\ny\tcolour=red\n' | $k put-feature graph 2>&1 >/dev/null); st=$?
check "bad feature line exit" 1 "$st"
check "bad feature line reported" 1 "$(echo "$err" | grep -c 'line 2: unknown field')"
check "nothing sent for bad input" $'x\tfound=false' "$($k get-feature graph x)"
check "put-feature on an embedding table" 1 "$(printf 'x\tlabel=1\n' | status_of $k put-feature emb)"

# ---- export and import: 2 shards -> 1 server -> 2 shards ----
check "export from two shards" 0 "$(status_of $k export emb "$work/emb.kbx")"
check "export file mode" "600" "$(stat -c %a "$work/emb.kbx")"
check "export refuses to overwrite" 1 "$(status_of $k export emb "$work/emb.kbx")"
check "export --force" 0 "$(status_of $k export emb "$work/emb.kbx" --force)"
check "import into one server" 0 "$(status_of $k --kb "$one" import emb1 "$work/emb.kbx")"
check "imported rows equal" "$($k get emb a b c d e f --meta | cut -f1,2,3)" \
  "$($k --kb "$one" get emb1 a b c d e f --meta | cut -f1,2,3)"
check "imported config (knn works)" $'a\t0.0625' "$($k --kb "$one" knn emb1 --k 1 --vector '0.75 0')"
check "export from one server" 0 "$(status_of $k --kb "$one" export emb1 "$work/emb1.kbx")"
check "import into two shards" 0 "$(status_of $k import emb2 "$work/emb1.kbx")"
check "round trip equal" "$($k get emb a b c d e f)" "$($k get emb2 a b c d e f)"
check "features export" 0 "$(status_of $k export graph "$work/graph.kbx")"
check "features import" 0 "$(status_of $k --kb "$one" import graph1 "$work/graph.kbx")"
check "features equal" "$($k get-feature graph 'n 1' n2 n3)" "$($k --kb "$one" get-feature graph1 'n 1' n2 n3)"

# Damaged files: refused with a reason, nothing imported (not even the table).
cp "$work/emb.kbx" "$work/bad.kbx"
printf '\x5a' | dd of="$work/bad.kbx" bs=1 seek=60 conv=notrunc 2>/dev/null
err=$($k import bad "$work/bad.kbx" 2>&1); st=$?
check "flipped byte refused" 1 "$st"
check "flipped byte message" 1 "$(echo "$err" | grep -c 'checksum mismatch.*nothing was imported')"
head -c 100 "$work/emb.kbx" > "$work/short.kbx"
err=$($k import bad "$work/short.kbx" 2>&1); st=$?
check "truncated refused" 1 "$st"
check "truncated message" 1 "$(echo "$err" | grep -c 'truncated')"
check "not an export" 1 "$(echo hello > "$work/txt"; status_of $k import bad "$work/txt")"
check "no table created" "" "$($k list-tables | grep '^bad')"
check "import over another config" 2 "$(status_of $k import emb "$work/graph.kbx")"
# ALREADY_EXISTS is read as the status enum (kb_cluster_last_status), not from the error text.
check "another config message" 1 "$($k import emb "$work/graph.kbx" 2>&1 | grep -c 'exists with another config')"

# ---- per-shard stats and checkpoint ----
check "stats per shard" 2 "$($k stats emb | grep -c '^shard [01] tcp://')"
check "checkpoint per shard" 2 "$($k checkpoint | grep -c '^committed_epoch:')"
check "one endpoint twice refused" 2 "$(status_of $k --kb "$one,$one" list-tables)"
check "shards in the wrong order refused" 2 "$(status_of $k --kb "$(cat "$work/s1.ep"),$(cat "$work/s0.ep")" get emb a b c d e f)"

# ---- CURVE (when the build has kb-keygen) ----
if [ -x "$bin/kb-keygen" ] && "$bin/kb-server" --help 2>&1 | grep -q -- --curve-secret; then
  mkdir -p "$work/keys/clients"
  "$bin/kb-keygen" "$work/keys/server" >/dev/null 2>&1
  "$bin/kb-keygen" "$work/keys/clients/alice" >/dev/null 2>&1
  "$bin/kb-keygen" "$work/keys/mallory" >/dev/null 2>&1
  start_server curve --curve-secret "$work/keys/server.key" --curve-allow "$work/keys/clients"
  ce=$(cat "$work/curve.ep")
  ck=(--curve-key "$work/keys/clients/alice.key" --curve-server-key "$work/keys/server.pub")
  check "curve: allowed client" 0 "$(status_of $k --kb "$ce" "${ck[@]}" create-table t --dim 2)"
  check "curve: allowed client writes and reads" $'x\t1 2' \
    "$(printf 'x\t1 2\n' | $k --kb "$ce" "${ck[@]}" put t 2>/dev/null; $k --kb "$ce" "${ck[@]}" get t x)"
  check "curve: without keys nothing" 2 "$(status_of $k --kb "$ce" --timeout-ms 300 --retries 0 list-tables)"
  check "curve: unlisted key nothing" 2 "$(status_of $k --kb "$ce" --timeout-ms 300 --retries 0 \
    --curve-key "$work/keys/mallory.key" --curve-server-key "$work/keys/server.pub" list-tables)"
  check "curve: wrong server key nothing" 2 "$(status_of $k --kb "$ce" --timeout-ms 300 --retries 0 \
    --curve-key "$work/keys/clients/alice.key" --curve-server-key "$work/keys/mallory.pub" list-tables)"
  check "curve: key flags go together" 1 "$(status_of $k --kb "$ce" --curve-key "$work/keys/clients/alice.key" list-tables)"
  check "curve: unreadable key file" 1 "$(status_of $k --kb "$ce" --curve-key "$work/nope.key" \
    --curve-server-key "$work/keys/server.pub" list-tables)"
else
  echo "CURVE part skipped: no kb-keygen or kb-server without --curve-secret"
fi

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
