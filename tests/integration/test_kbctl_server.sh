#!/usr/bin/env bash
# Integration: kbctl against a real kb-server. Exact text output, exit codes, and a restart.
# Usage: test_kbctl_server.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: test_kbctl_server.sh BIN_DIR}
work=$(mktemp -d /tmp/carls-kbctl-XXXXXX)
. "$(dirname "$0")/kbctl_testlib.sh"

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

# NumPy: export an embedding table as .npy + keys, import it into a new table, put from .npy; bad files are
# refused naming the file and the row or line, and nothing is written.
printf 'k1\t1 2 3\nk 2\t4 5 6\nk3\t7 8 9.5\n' | $k create-table vec --dim 3 >/dev/null 2>&1
printf 'k1\t1 2 3\nk 2\t4 5 6\nk3\t7 8 9.5\n' | $k put vec 2>/dev/null
check "export npy" 0 "$(status_of $k export vec "$work/vec.npy" --keys "$work/vec.keys")"
check "npy magic" "NUMPY" "$(head -c 6 "$work/vec.npy" | tail -c 5)"
check "keys file" 3 "$(wc -l < "$work/vec.keys")"
check "export npy needs --keys" 1 "$(status_of $k export vec "$work/other.npy")"
check "export npy refuses to overwrite" 1 "$(status_of $k export vec "$work/vec.npy" --keys "$work/vec.keys")"
check "import npy" 0 "$(status_of $k import vec2 "$work/vec.npy" --keys "$work/vec.keys")"
check "imported rows" $'k1\t1 2 3\nk 2\t4 5 6\nk3\t7 8 9.5' "$($k get vec2 k1 'k 2' k3)"
check "put npy" 0 "$(status_of $k put vec2 --npy "$work/vec.npy" --keys "$work/vec.keys" --version 3)"
check "put npy version" "3" "$($k get vec2 k3 --meta | cut -f3)"
# a NaN in row 1 (the data starts at byte 128: NumPy pads the header to a multiple of 64)
cp "$work/vec.npy" "$work/nan.npy"
printf '\x00\x00\xc0\x7f' | dd of="$work/nan.npy" bs=1 seek=$((128 + 12)) conv=notrunc 2>/dev/null
err=$($k import vec3 "$work/nan.npy" --keys "$work/vec.keys" 2>&1); st=$?
check "NaN npy exit" 1 "$st"
check "NaN npy names file and row" 1 "$(echo "$err" | grep -c 'nan.npy: row 1, column 0: NaN')"
check "NaN npy wrote nothing" 2 "$(status_of $k get vec3 k1)"
head -c 140 "$work/vec.npy" > "$work/short.npy"
check "truncated npy names the file" 1 "$($k import vec3 "$work/short.npy" --keys "$work/vec.keys" 2>&1 | grep -c 'short.npy: truncated')"
printf 'k1\nk2\n' > "$work/two.keys"
check "key count" 1 "$($k put vec2 --npy "$work/vec.npy" --keys "$work/two.keys" 2>&1 | grep -c 'has 3 rows but .*two.keys has 2 keys')"
printf 'k1\n\nk3\nk4\n' > "$work/blank.keys"
check "blank key line" 1 "$($k put vec2 --npy "$work/vec.npy" --keys "$work/blank.keys" 2>&1 | grep -c 'blank.keys: line 2: ')"
check "still the first values" $'k1\t1 2 3' "$($k get vec2 k1)"
check "drop npy tables" "0 0" "$(status_of $k drop-table vec) $(status_of $k drop-table vec2)"

# A clean restart keeps everything.
stop_server
start_server
check "after restart" $'a key\t0.1 -3.40282347e+38 1e-30\nb\t-0.5 2 3' "$($k get emb 'a key' b)"
check "drop" 0 "$(status_of $k drop-table emb)"
check "dropped" 2 "$(status_of $k get emb b)"
check "drop if-exists" 0 "$(status_of $k drop-table emb --if-exists)"
stop_server

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
