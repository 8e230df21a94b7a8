# Shared by the kbctl shell tests: one kb-server in $work and the check helpers. Source it after setting
# bin (the programs' folder) and work (a fresh temporary folder, removed at exit).
server=
failures=0
passes=0

start_server() { # start_server [EXTRA ARGS...]: a kb-server on $work/data; CARLS_KB points at it
  rm -f "$work/endpoint"
  "$bin/kb-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$work/endpoint" --data "$work/data" "$@" \
    2>>"$work/server.log" &
  server=$!
  for _ in $(seq 200); do [ -s "$work/endpoint" ] && break; sleep 0.05; done
  [ -s "$work/endpoint" ] || { echo "server did not start"; cat "$work/server.log"; exit 1; }
  export CARLS_KB=$(cat "$work/endpoint")
}
stop_server() { kill -TERM "$server"; wait "$server"; server=; }
cleanup() { [ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

check() { # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then passes=$((passes + 1)); else
    failures=$((failures + 1)); printf 'FAIL %s\n  expected: %q\n  actual:   %q\n' "$1" "$2" "$3"; fi
}
status_of() { "$@" >/dev/null 2>&1; echo $?; }
