#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite twice: once in build/ (with the CUDA
# kernels compiled when nvcc is present) and once in build-asan/ under AddressSanitizer and
# UndefinedBehaviorSanitizer (CPU paths only, since CUDA code cannot run under ASan). In between it builds
# Release (-O3, whose inlining shows GCC more warnings) in build-release/, which must compile under -Werror too.
# Usage: scripts/test.sh            (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=$(nproc)

echo "== build (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== build (build-release/, Release: compile only)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j "$jobs"

echo "== build (build-asan/, ASan+UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCARLS_SANITIZE=ON -DCARLS_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
echo "== tests (build-asan/, ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
