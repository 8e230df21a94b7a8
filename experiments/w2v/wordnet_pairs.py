#!/usr/bin/env python3
"""Synonym pairs for the word2vec quality check, built from Debian's WordNet 3.0 (package wordnet-base) and
the corpus's own vocabulary, split into a validation half (to choose settings) and a test half (scored once,
after the settings are frozen). docs/EXPERIMENTS.md "Word2vec defaults" says how they were used.

Usage: wordnet_pairs.py TOKENS_FILE OUT_DIR [MIN_COUNT]
  TOKENS_FILE  the corpus as the trainer tokenizes it (trainer word2vec --corpus kjv --tokenize-only)
Writes OUT_DIR/wordnet_valid.txt and OUT_DIR/wordnet_test.txt: 'word1 word2 10' lines (w2v-eval --pairs
format), word1 the more frequent of the two, each unordered pair once.

A pair: two different single-word lemmas (letters only, lower case in WordNet) of one synset, both seen at
least MIN_COUNT (default 5) times in the corpus. The split is by a hash of word1 (CRC-32, even: validation),
so no question word is in both halves."""
import collections
import sys
import zlib

WN = "/usr/share/wordnet"


def synsets():
    for pos in ("noun", "verb", "adj", "adv"):
        with open(f"{WN}/data.{pos}", encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                fields = line.split()
                count = int(fields[3], 16)
                yield [fields[4 + 2 * i] for i in range(count)]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tokens, out = sys.argv[1], sys.argv[2]
    min_count = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    counts = collections.Counter()
    with open(tokens, encoding="utf-8") as f:
        for line in f:
            counts.update(line.split())
    pairs = set()
    for words in synsets():
        words = sorted({w.split("(")[0] for w in words})  # adjectives carry markers like "(a)"
        words = [w for w in words if w.isalpha() and w.islower() and counts[w] >= min_count]
        for i, a in enumerate(words):
            for b in words[i + 1:]:
                first, second = (a, b) if (counts[a], a) > (counts[b], b) else (b, a)
                pairs.add((first, second))
    halves = {"valid": [], "test": []}
    for a, b in sorted(pairs):
        halves["valid" if zlib.crc32(a.encode()) % 2 == 0 else "test"].append(f"{a} {b} 10\n")
    for name, lines in halves.items():
        with open(f"{out}/wordnet_{name}.txt", "w", encoding="utf-8") as f:
            f.writelines(lines)
        print(f"{out}/wordnet_{name}.txt: {len(lines)} pairs")


if __name__ == "__main__":
    main()
