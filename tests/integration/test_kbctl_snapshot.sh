#!/usr/bin/env bash
# Integration: kbctl's snapshot verbs (snapshot, snapshots, snapshot-delete) and kb-server --restore against a
# real kb-server: output lines, exit statuses, a restore that brings back the snapshot's values.
# Usage: test_kbctl_snapshot.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: test_kbctl_snapshot.sh BIN_DIR}
work=$(mktemp -d /tmp/carls-kbctl-snap-XXXXXX)
. "$(dirname "$0")/kbctl_testlib.sh"

start_server
k=$bin/kbctl
$k create-table emb --dim 2 --init zeros 2>/dev/null
printf 'a\t1 2\n' | $k put emb 2>/dev/null

out=$($k snapshot s1); st=$?
check "snapshot exit" 0 "$st"
check "snapshot line: name, tables, valid" "s1 emb valid" "$(echo "$out" | cut -f1,4,6 | tr '\t' ' ')"
check "snapshot line: time" 1 "$(echo "$out" | cut -f2 | grep -c '^20[0-9-]*T[0-9:]*Z$')"
check "snapshot again: exists" 2 "$(status_of $k snapshot s1)"
check "bad name" 2 "$(status_of $k snapshot ../x)"
check "no name: usage" 1 "$(status_of $k snapshot)"
check "snapshot help" 0 "$(status_of $k snapshot --help)"
check "snapshots help" 0 "$(status_of $k snapshots --help)"
check "snapshot-delete help" 0 "$(status_of $k snapshot-delete --help)"

printf 'a\t5 6\n' | $k put emb 2>/dev/null
$k snapshot s2 >/dev/null
check "list" $'s1\tvalid\ns2\tvalid' "$($k snapshots --verify | cut -f1,6)"
check "delete" 0 "$(status_of $k snapshot-delete s2)"
check "delete again: not found" 2 "$(status_of $k snapshot-delete s2)"
check "list after delete" "s1" "$($k snapshots | cut -f1)"

stop_server
check "restore help" 1 "$($bin/kb-server --help | grep -c -- '--restore NAME')"
start_server --restore s1
check "restored value" $'a\t1 2' "$($k get emb a)"
check "snapshot kept" "s1" "$($k snapshots | cut -f1)"
stop_server

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
