#!/usr/bin/env bash
# The replication figures of docs/BENCHMARKS.md (issue 37), with real kb-server processes on loopback:
#   put.sync.replica1   kb-bench's put.sync against a primary with --min-replicas 1 and one follower, as a
#                       ratio to put.sync against a lone server measured in alternating rounds
#   failover.kill9      kill -9 of a primary (--min-replicas 1, one follower) to the first write the promoted
#                       follower acknowledges: `kbctl replica promote` then `kbctl put`, what a coordinator
#                       that has reaped the dead process does (its detection is not in the figure)
#   replication.lag     the worst lag_ms `kbctl replica status` shows every 100 ms while kb-bench's push
#                       case runs against a primary in interval:1000 durability with one follower
# usage: bench/replication_figures.sh BIN_DIR [ROUNDS (3)] [FAILOVERS (20)]
set -euo pipefail
bin=${1:?usage: replication_figures.sh BIN_DIR [ROUNDS] [FAILOVERS]}
rounds=${2:-3}
failovers=${3:-20}
work=$(mktemp -d /tmp/carls-repl-fig-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start NAME ARGS...: a kb-server on a free port; sets $ep and $pid.
start() {
  local name=$1; shift
  rm -f "$work/$name.ep"
  "$bin/kb-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/$name.ep" --data "$work/$name" "$@" \
    >>"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 200); do [ -s "$work/$name.ep" ] && break; sleep 0.05; done
  ep=$(cat "$work/$name.ep")
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
set +m

# wait_live PRIMARY_EP: until the primary counts its follower live.
wait_live() {
  for _ in $(seq 1 100); do
    "$bin/kbctl" --kb "$1" replica status 2>/dev/null | grep -q 'live=yes' && return 0
    sleep 0.05
  done
  echo "the follower never became live" >&2
  return 1
}

put_sync() { # ENDPOINT -> rows/s of kb-bench's put.sync
  "$bin/kb-bench" --connect "$1" --cases put --seconds 3 --warmup 1 --json --redis-server none 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r["case"]=="put.sync": print(r["value"], r["p50_us"])'
}

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
echo "== put.sync: lone server vs primary with --min-replicas 1 and one follower ($rounds alternating rounds)"
for r in $(seq 1 "$rounds"); do
  rm -rf "$work"/solo*; start solo; solo=$pid
  read -r lone lone_p50 <<<"$(put_sync "$ep")"
  stop "$solo"
  rm -rf "$work"/p "$work"/f
  start p --min-replicas 1; p=$pid; pep=$ep
  start f --replica-of "$pep"; f=$pid
  wait_live "$pep"
  read -r repl repl_p50 <<<"$(put_sync "$pep")"
  stop "$p"; stop "$f"
  # The same pair with --min-replicas 0: the follower's work without waiting for it.
  rm -rf "$work"/p "$work"/f
  start p --replication-listen 'tcp://127.0.0.1:*'; p=$pid; pep=$ep
  start f --replica-of "$pep"; f=$pid
  wait_live "$pep"
  read -r k0 k0_p50 <<<"$(put_sync "$pep")"
  stop "$p"; stop "$f"
  python3 -c "print(f'round $r: lone {float($lone):,.0f} rows/s (p50 {float($lone_p50):.0f} us); one follower, K=1: {float($repl):,.0f} (p50 {float($repl_p50):.0f} us), ratio {float($repl)/float($lone):.2f}; K=0: {float($k0):,.0f} (p50 {float($k0_p50):.0f} us), ratio {float($k0)/float($lone):.2f}')"
done

echo "== failover.kill9 ($failovers times): kill -9 of the primary to the first put the promoted follower acknowledges"
times=()
for i in $(seq 1 "$failovers"); do
  rm -rf "$work"/p "$work"/f
  start p --min-replicas 1; p=$pid; pep=$ep
  start f --replica-of "$pep"; f=$pid; fep=$ep
  wait_live "$pep"
  "$bin/kbctl" --kb "$pep" create-table t --dim 8 >/dev/null 2>&1
  printf 'k\t1 2 3 4 5 6 7 8\n' | "$bin/kbctl" --kb "$pep" put t >/dev/null 2>&1
  t0=$(date +%s%N)
  kill -9 "$p"; wait "$p" 2>/dev/null || true
  "$bin/kbctl" --kb "$fep" replica promote --term 2 >/dev/null 2>&1
  printf 'k\t8 7 6 5 4 3 2 1\n' | "$bin/kbctl" --kb "$fep" put t >/dev/null 2>&1
  t1=$(date +%s%N)
  times+=($(( (t1 - t0) / 1000000 )))
  stop "$f"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "failover ms: median %d, max %d, min %d (n=%d)\n", a[int((NR+1)/2)], a[NR], a[1], NR}'

echo "== replication.lag under kb-bench's push case (interval:1000, one follower)"
rm -rf "$work"/p "$work"/f
start p --durability interval:1000 --replication-listen 'tcp://127.0.0.1:*'; p=$pid; pep=$ep
start f --durability interval:1000 --replica-of "$pep"; f=$pid
wait_live "$pep"
( while true; do "$bin/kbctl" --kb "$pep" replica status 2>/dev/null | sed -n 's/.*lag_ms=\([0-9]*\).*/\1/p'; sleep 0.1; done ) >"$work/lag.txt" &
sampler=$!
"$bin/kb-bench" --connect "$pep" --cases push --seconds 10 --json --redis-server none 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l)
    print("push:", r["case"], round(r["value"]), r["unit"])'
kill "$sampler" 2>/dev/null || true
sort -n "$work/lag.txt" | awk '{a[NR]=$1} END {p = int(NR * 0.99); if (p < 1) p = 1; if (NR) printf "lag ms over %d samples: p50 %d, p99 %d, max %d\n", NR, a[int((NR+1)/2)], a[p], a[NR]}'
stop "$p"; stop "$f"
