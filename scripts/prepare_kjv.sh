#!/usr/bin/env bash
# Dumps the King James Bible (Debian's bible-kjv-text, read with the bible-kjv program) as plain text, one verse
# per line without its reference, for trainer word2vec --corpus FILE and for other tools (fastText). The trainer
# can also read it directly with --corpus kjv. Idempotent: an existing, non-empty output is left as it is.
# Usage: scripts/prepare_kjv.sh [OUT]   (default out/kjv.txt)
set -euo pipefail

out="${1:-out/kjv.txt}"
if [ -s "$out" ]; then
  echo "prepare_kjv: $out exists ($(wc -l < "$out") verses)"
  exit 0
fi
if ! command -v bible > /dev/null; then
  echo "prepare_kjv: the 'bible' program is missing: run scripts/setup.sh (packages bible-kjv, bible-kjv-text)" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
# `bible` prints chapter headings ("Genesis 1"), blank lines and verses ("  1 In the beginning ..."): keep the
# verse text only (the same rule as data/data_text.c).
bible -l100000 gen1:1-rev22:21 | sed -n 's/^[ \t][ \t]*[0-9][0-9]* //p' > "$tmp"
n=$(wc -l < "$tmp")
if [ "$n" -ne 31102 ]; then
  echo "prepare_kjv: expected 31102 verses, got $n" >&2
  rm -f "$tmp"
  exit 1
fi
mv "$tmp" "$out"
echo "prepare_kjv: wrote $out ($n verses, $(wc -w < "$out") words)"
