#!/usr/bin/env bash
# The CI guard of the experiments' request shapes (issue 36): kb-bench's workload cases, three rounds, each
# figure the median round's ratio to its floor measured in the same run (in-process FAISS, a raw ZeroMQ
# echo). It fails when a figure falls below a third of its target: a 5x slowdown of a stage that meets its
# target fails, the tens of percent that noise moves a ratio do not. Timings are the benchmark's; this test
# asserts ratios only. Not run under the sanitizers (they slow the server, not the floors).
# Usage: test_workload_guard.sh BUILD_DIR
set -uo pipefail
bin=$1/bin
out=$(mktemp /tmp/carls-guard-XXXXXX)
trap 'rm -f "$out"' EXIT
"$bin/kb-bench" --cases workload --repeat 3 --guard --json >"$out"
rc=$?
cat "$out"
cases=$(grep -c '"case":"wl\.' "$out")
echo "workload figures: $cases, kb-bench exit $rc"
if [ "$cases" -ne 6 ]; then
  echo "FAIL: expected 6 workload figures (wl.*), got $cases" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "FAIL: kb-bench --guard exited $rc (a guarded figure is below a third of its target, or a case failed)" >&2
  exit 1
fi
