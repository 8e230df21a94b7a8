#!/usr/bin/env bash
# Integration: kbctl against a real kb-server. Exact text output, exit codes, and a restart.
# Usage: test_kbctl_server.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: test_kbctl_server.sh BIN_DIR}
work=$(mktemp -d /tmp/carls-kbctl-XXXXXX)
server=
failures=0
passes=0

start_server() {
  rm -f "$work/endpoint"
  "$bin/kb-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/endpoint" --data "$work/data" \
    2>>"$work/server.log" &
  server=$!
  for _ in $(seq 200); do [ -s "$work/endpoint" ] && break; sleep 0.05; done
  [ -s "$work/endpoint" ] || { echo "server did not start"; cat "$work/server.log"; exit 1; }
  export CARLS_KB=$(cat "$work/endpoint")
}
stop_server() { kill -TERM "$server"; wait "$server"; }
cleanup() { [ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

check() { # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then passes=$((passes + 1)); else
    failures=$((failures + 1)); printf 'FAIL %s\n  expected: %q\n  actual:   %q\n' "$1" "$2" "$3"; fi
}
status_of() { "$@" >/dev/null 2>&1; echo $?; }

start_server
k=$bin/kbctl

check "create" 0 "$(status_of $k create-table emb --dim 3 --optimizer sgd --lr 0.5 --max-age-ms 600000 --init zeros)"
check "create again fails (server error)" 2 "$(status_of $k create-table emb --dim 3)"
check "create if-not-exists same config" 0 \
  "$(status_of $k create-table emb --dim 3 --optimizer sgd --lr 0.5 --max-age-ms 600000 --init zeros --if-not-exists)"

# Values that need all 9 significant digits round-trip exactly; keys may hold spaces.
printf 'a key\t0.1 -3.40282347e+38 1e-30\nb\t1 2 3\n' | $k put emb --version 7 2>/dev/null
check "get exact" $'a key\t0.1 -3.40282347e+38 1e-30\nb\t1 2 3' "$($k get emb 'a key' b)"
check "get meta version" "7" "$($k get emb b --meta | cut -f3)"

# Lazy average: 2 and 4 with lr 0.5 move by -1.5; pushes in one request for the same key count twice.
printf 'b\t2 0 0\nb\t4 0 0\n' | $k push-grad emb 2>/dev/null
check "pending before lookup" "pending_gradients: 2" "$($k stats emb | grep -o 'pending_gradients: [0-9]*')"
check "lazy average" $'b\t-0.5 2 3' "$($k get emb b)"
check "applied once" $'b\t-0.5 2 3' "$($k get emb b)"

# Input errors: nothing is sent, exit 1, line number reported.
err=$(printf 'b\t1 2\n' | $k put emb 2>&1 >/dev/null); st=$?
check "wrong count exit" 1 "$st"
check "wrong count message names line" 1 "$(echo "$err" | grep -c 'line 1')"
check "NaN refused" 1 "$(printf 'b\tnan 1 2\n' | $k push-grad emb >/dev/null 2>&1; echo $?)"
check "still unchanged" $'b\t-0.5 2 3' "$($k get emb b)"

# Server errors: exit 2.
check "unknown table" 2 "$(status_of $k get nope x)"
check "no endpoint" 1 "$(env -u CARLS_KB $k list-tables >/dev/null 2>&1; echo $?)"
check "help" 0 "$(status_of $k --help)"
check "server help" 0 "$(status_of $bin/kb-server --help)"

check "checkpoint" 0 "$(status_of $k checkpoint)"
check "list" $'emb\t3\t2\tsgd\tlazy' "$($k list-tables)"

# A clean restart keeps everything.
stop_server
start_server
check "after restart" $'a key\t0.1 -3.40282347e+38 1e-30\nb\t-0.5 2 3' "$($k get emb 'a key' b)"
check "drop" 0 "$(status_of $k drop-table emb)"
check "dropped" 2 "$(status_of $k get emb b)"
check "drop if-exists" 0 "$(status_of $k drop-table emb --if-exists)"
stop_server
server=

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
