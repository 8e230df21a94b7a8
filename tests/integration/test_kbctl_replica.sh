#!/usr/bin/env bash
# Integration: kbctl's replica verbs (status, promote, fence, set) against a real replicated shard, a primary
# with --min-replicas 1 and its follower: roles and terms, a row written on the primary read on the follower,
# a write, a snapshot and a checkpoint on the follower refused with NOT_PRIMARY naming the primary, then kill -9
# of the primary, promotion of the follower (term 2) that takes writes, a second promotion refused, a fence
# that stops writes; a primary started again on an empty data directory (a new lineage) refused to
# overwrite its follower's rows; and a member of another lineage that holds no epoch taken in as a follower.
# Usage: test_kbctl_replica.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: test_kbctl_replica.sh BIN_DIR}
work=$(mktemp -d /tmp/carls-kbctl-replica-XXXXXX)
. "$(dirname "$0")/kbctl_testlib.sh"
k=$bin/kbctl
primary= follower=
cleanup() { # both members (kbctl_testlib.sh's trap calls this)
  for p in $primary $follower; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}

start_member() { # start_member NAME [EXTRA ARGS...]: a kb-server on $work/NAME; its endpoint in $work/NAME.ep
  local name=$1; shift
  "$bin/kb-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/$name.ep" --data "$work/$name" "$@" \
    2>>"$work/$name.log" &
  member=$!
  for _ in $(seq 200); do [ -s "$work/$name.ep" ] && break; sleep 0.05; done
  [ -s "$work/$name.ep" ] || { echo "$name did not start"; cat "$work/$name.log"; exit 1; }
}
field() { # field KEY: the value of "KEY: value" in the status on stdin
  sed -n "s/^$1: //p"
}

start_member primary --min-replicas 1
primary=$member
P=$(cat "$work/primary.ep")
start_member follower --replica-of "$P" --member follower-1 # a name, not an endpoint: promote binds --listen's host
follower=$member
F=$(cat "$work/follower.ep")

# The follower says hello to the primary; wait until the primary counts it live and the follower has
# applied a round of term 1 (it has no term before its first round).
for _ in $(seq 100); do
  [ "$($k --kb "$P" replica status 2>/dev/null | grep -c 'live=yes$')" == 1 ] &&
    [ "$($k --kb "$F" replica status 2>/dev/null | field term)" == 1 ] && break
  sleep 0.1
done
status=$($k --kb "$P" replica status); st=$?
check "primary status exit" 0 "$st"
check "primary role" primary "$(echo "$status" | field role)"
check "primary term" 1 "$(echo "$status" | field term)"
check "primary min replicas" 1 "$(echo "$status" | field min_replicas)"
check "primary: one follower" 1 "$(echo "$status" | field followers)"
check "primary: the follower live" "follower: follower-1 live=yes" \
  "$(echo "$status" | grep '^follower: ' | sed 's/ acked_epoch=[0-9]* lag_ms=[0-9]*//')"
check "primary: replication endpoint" 1 "$(echo "$status" | field replication_endpoint | grep -c '^tcp://127.0.0.1:')"
status=$($k --kb "$F" replica status)
check "follower role" follower "$(echo "$status" | field role)"
check "follower term" 1 "$(echo "$status" | field term)"
check "follower's primary" "$P" "$(echo "$status" | field primary)"
check "follower status json" 1 "$($k --kb "$F" replica status --json | grep -c '^{"role":"follower","term":1,')"

check "create table on the primary" 0 "$(status_of $k --kb "$P" create-table emb --dim 2 --init zeros)"
printf 'a\t1 2\n' | $k --kb "$P" put emb 2>/dev/null
check "put on the primary" 0 "$?"
check "the follower has the row" $'a\t1 2' "$($k --kb "$F" get emb a)"
# --read-replica-ms: with the primary stopped, a read within the bound is the follower's at once (not the
# primary's 20 s attempt: timeout 10 would end it).
kill -STOP "$primary"
got=$(timeout 10 $k --kb "$P|$F" --timeout-ms 20000 --read-replica-ms 60000 get emb --no-create a); st=$?
kill -CONT "$primary"
check "--read-replica-ms: served by the follower" "0 "$'a\t1 2' "$st $got"
check "--read-replica-ms: not a number" 1 "$(status_of $k --kb "$F" --read-replica-ms x list-tables)"
err=$(printf 'b\t3 4\n' | $k --kb "$F" put emb 2>&1 >/dev/null); st=$?
check "put on the follower: exit" 2 "$st"
check "put on the follower: NOT_PRIMARY naming the primary" 1 "$(echo "$err" | grep -c "NOT_PRIMARY: .*$P")"
# A snapshot or checkpoint would wait on the follower for a commit only the primary makes: refused at once.
for verb in "snapshot s1" checkpoint; do
  err=$($k --kb "$F" --timeout-ms 3000 --retries 0 $verb 2>&1 >/dev/null); st=$?
  check "$verb on the follower: exit" 2 "$st"
  check "$verb on the follower: NOT_PRIMARY naming the primary" 1 "$(echo "$err" | grep -c "NOT_PRIMARY: .*$P")"
done
# Listing its snapshots reads the follower's own files: answered.
check "snapshots on the follower" 0 "$(status_of $k --kb "$F" --timeout-ms 3000 --retries 0 snapshots)"

kill -9 "$primary"; wait "$primary" 2>/dev/null; primary=
# The coordinator's sequence (docs/REPLICATION.md section 4): fence with the new term, promote with the same.
check "fence the follower" 0 "$(status_of $k --kb "$F" replica fence --term 2)"
check "fenced follower: term" 2 "$($k --kb "$F" replica status | field term)"
check "promote the follower" 0 "$(status_of $k --kb "$F" replica promote --term 2)"
status=$($k --kb "$F" replica status)
check "promoted: role" primary "$(echo "$status" | field role)"
check "promoted: term" 2 "$(echo "$status" | field term)"
printf 'b\t3 4\n' | $k --kb "$F" put emb 2>/dev/null
check "put on the new primary" 0 "$?"
check "the new primary's rows" $'a\t1 2\nb\t3 4' "$($k --kb "$F" get emb a b)"
err=$($k --kb "$F" replica promote --term 2 2>&1 >/dev/null); st=$?
check "promote again: exit" 2 "$st"
check "promote again: the server's refusal" 1 "$(echo "$err" | grep -c '^kbctl replica promote: INVALID_ARGUMENT: ')"
check "fence at term 3" 0 "$(status_of $k --kb "$F" replica fence --term 3)"
check "fenced: term" 3 "$($k --kb "$F" replica status | field term)"
err=$(printf 'c\t5 6\n' | $k --kb "$F" put emb 2>&1 >/dev/null); st=$?
check "put after the fence: exit" 2 "$st"
check "put after the fence: NOT_PRIMARY" 1 "$(echo "$err" | grep -c 'NOT_PRIMARY')"

# The command line.
check "help" 0 "$(status_of $k replica --help)"
check "in kbctl --help" 1 "$($k --help | grep -c '^  kbctl replica status|promote|fence|set')"
check "a list of members: usage" 1 "$(status_of $k --kb "$F,$F" replica status)"
check "promote without --term: usage" 1 "$(status_of $k --kb "$F" replica promote)"
check "set without --min-replicas: usage" 1 "$(status_of $k --kb "$F" replica set)"
check "status with --term: usage" 1 "$(status_of $k --kb "$F" replica status --term 4)"
check "unknown action: usage" 1 "$(status_of $k --kb "$F" replica elect)"
check "no action: usage" 1 "$(status_of $k --kb "$F" replica)"

kill -TERM "$follower"; wait "$follower"; st=$?; follower=
check "follower stops cleanly" 0 "$st"

# A primary that lost its data (killed, its directory gone, started again empty on the same endpoint: a new
# history of the shard) must not overwrite its follower's rows with its own emptiness: the follower holds
# epochs of another lineage, the primary refuses it and says why, the follower keeps its rows.
start_member p2 --replication-listen 'tcp://127.0.0.1:*'
primary=$member
P2=$(cat "$work/p2.ep")
start_member f2 --replica-of "$P2"
follower=$member
F2=$(cat "$work/f2.ep")
$k --kb "$P2" create-table emb --dim 2 --init zeros >/dev/null 2>&1
printf 'x\t7 8\n' | $k --kb "$P2" put emb 2>/dev/null
check "p2: put" 0 "$?"
for _ in $(seq 100); do [ "$($k --kb "$F2" get emb x --no-create 2>/dev/null)" == $'x\t7 8' ] && break; sleep 0.05; done
check "f2 has the row" $'x\t7 8' "$($k --kb "$F2" get emb x --no-create 2>/dev/null)"
kill -9 "$primary"; wait "$primary" 2>/dev/null
rm -rf "$work/p2" "$work/p2.ep"
"$bin/kb-server" --listen "$P2" --endpoint-file "$work/p2.ep" --data "$work/p2" --replication-listen 'tcp://127.0.0.1:*' \
  2>>"$work/p2.log" &
primary=$!
refusal='of another history of this shard (lineage '
for _ in $(seq 200); do grep -q "$refusal" "$work/p2.log" && break; sleep 0.05; done
check "the empty primary refuses to overwrite the follower" 1 "$(grep -c "$refusal" "$work/p2.log" | head -c 1)"
check "f2 keeps its row" $'x\t7 8' "$($k --kb "$F2" get emb x --no-create 2>/dev/null)"
kill -TERM "$follower"; wait "$follower"; follower=
kill -TERM "$primary"; wait "$primary"; primary=

# A member that has a history of its own but holds no epoch of it (started once as a primary, nothing
# written) and is then made the follower of another primary takes that primary's history: nothing of its
# own is overwritten, so it is not refused (the primary lets it in, and it must not refuse the rounds).
start_member p3 --replication-listen 'tcp://127.0.0.1:*'
kill -TERM "$member"; wait "$member"
start_member q --replication-listen 'tcp://127.0.0.1:*'
primary=$member
Q=$(cat "$work/q.ep")
$k --kb "$Q" create-table emb --dim 2 --init zeros >/dev/null 2>&1
printf 'y\t3 4\n' | $k --kb "$Q" put emb 2>/dev/null
rm -f "$work/p3.ep"
start_member p3 --replica-of "$Q"
follower=$member
F3=$(cat "$work/p3.ep")
for _ in $(seq 100); do [ "$($k --kb "$F3" get emb y --no-create 2>/dev/null)" == $'y\t3 4' ] && break; sleep 0.05; done
check "an empty member of another history takes the primary's rows" $'y\t3 4' \
  "$($k --kb "$F3" get emb y --no-create 2>/dev/null)"
check "and refuses none of its rounds" 0 "$(grep -c 'another history' "$work/p3.log")"
kill -TERM "$follower"; wait "$follower"; follower=
echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
