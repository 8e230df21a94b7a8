#!/usr/bin/env bash
# Clients never link server code: the programs that talk to a bank (kbctl, kb-keygen, kb-bench, trainer,
# kb-maker, carls) must define no symbol of the server's modules. kb-server itself is the positive control:
# the same pattern must find its symbols, or the check could not fail. With SHARED_LIB (libcarls_client.so)
# the library gets the same check, and its dynamic exports must be kb_ffi_* (client/kb_ffi.h) alone.
# Usage: test_no_server_code.sh BIN_DIR [SHARED_LIB]
set -euo pipefail
bin=$1
lib=${2:-}
server_symbols=' [TtDdBbRr] (kb_service_|kb_table_|kb_bank_|kb_store_|kb_server_|kb_lazy_|kb_dedup_|kb_sampler_|kb_metrics_|kb_optimizer_|kb_rowmap_|kb_bloom_|kb_init_|kb_auth_new|kb_auth_setup_server)'

control=$(nm --defined-only "$bin/kb-server" | grep -cE "$server_symbols" || true)
if [ "$control" -lt 20 ]; then
  echo "FAIL: the pattern finds only $control server symbols in kb-server itself; the check is broken"
  exit 1
fi
echo "kb-server: $control server symbols (control)"

fail=0
# check_no_server_symbols FILE NAME: FILE (NAME in the messages) defines no symbol of the server's modules.
check_no_server_symbols() {
  local found
  if [ ! -f "$1" ]; then
    echo "FAIL: $1 not found"
    fail=1
    return
  fi
  found=$(nm --defined-only "$1" | grep -E "$server_symbols" || true)
  if [ -n "$found" ]; then
    echo "FAIL: $2 links server code:"
    echo "$found" | head -5
    fail=1
  else
    echo "ok: $(basename "$2") defines no server symbol"
  fi
}

for prog in kbctl kb-keygen kb-bench trainer kb-maker carls; do
  if [ ! -x "$bin/$prog" ]; then
    echo "FAIL: $bin/$prog not built"
    fail=1
    continue
  fi
  check_no_server_symbols "$bin/$prog" "$prog"
done
if [ -n "$lib" ]; then
  check_no_server_symbols "$lib" "$lib"
  exports=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }')
  if [ -z "$(echo "$exports" | grep -E '^kb_ffi_open(@|$)' || true)" ]; then
    echo "FAIL: $lib does not export kb_ffi_open; the export check is broken"
    fail=1
  fi
  others=$(echo "$exports" | grep -vE '^kb_ffi_' || true)
  if [ -n "$others" ]; then
    echo "FAIL: $lib exports more than kb_ffi_*:"
    echo "$others" | head -5
    fail=1
  else
    echo "ok: $(basename "$lib") exports $(echo "$exports" | wc -l) symbols, all kb_ffi_*"
  fi
fi
exit $fail
