#!/usr/bin/env python3
"""Which testament is a verse from? A bag-of-words classifier over the King James Bible (Debian's
bible-kjv), whose word vectors live in a carls-c bank and train there.

Each verse is the mean of its words' rows, looked up by the words themselves through
carls.torch.DynamicEmbedding (no vocabulary: a word seen for the first time gets a row), followed by a
torch Linear layer. backward() pushes the words' gradients to the bank, whose optimizer (here adagrad with
lazy updates) steps them; torch's own optimizer steps the Linear layer. Training and test verses are drawn
at random, as many from each testament, so chance is 50 %. Prints the test accuracy after each epoch.
With --baseline it then trains the same model with its word vectors in a local torch.nn.Embedding (a
vocabulary of the training words, unseen words mapped to one extra row) and torch's Adagrad, for comparison.

    build/bin/kb-server --listen tcp://127.0.0.1:7070 --data /tmp/kb &
    PYTHONPATH=python python3 examples/kjv_testament.py --bank tcp://127.0.0.1:7070
"""
import argparse
import random
import re
import subprocess
import sys
import time

import numpy as np
import torch

import carls
import carls.torch

KJV_COMMAND = ["bible", "-l100000", "gen1:1-rev22:21"]  # as data/data_text.h reads it
FIRST_NT_BOOK = "Matthew"


def kjv_verses():
    """(words, is_new_testament) per verse of the KJV, from the bible program's output: chapter headings
    ("Matthew 1") say the book, verse lines ("  1 In the beginning ...") the text."""
    try:
        text = subprocess.run(KJV_COMMAND, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("kjv_testament: cannot run %s (%s): install bible-kjv (scripts/setup.sh)" % (KJV_COMMAND[0], e))
    verses, new_testament = [], False
    verse_line = re.compile(r"^\s+\d+ (.*)$")
    for line in text.splitlines():
        m = verse_line.match(line)
        if m:
            words = [w.strip("'") for w in re.findall(r"[a-z']+", m.group(1).lower())]
            words = [w for w in words if w]
            if words:
                verses.append((words, new_testament))
        elif line.strip():
            new_testament = new_testament or line.split()[0] == FIRST_NT_BOOK
    return verses


def balanced_split(verses, n_train, n_test, seed):
    """n_train + n_test verses from each testament, shuffled; (train, test)."""
    rng = random.Random(seed)
    by_class = [[v for v in verses if v[1] == c] for c in (False, True)]
    for vs in by_class:
        rng.shuffle(vs)
        if len(vs) < n_train + n_test:
            sys.exit("kjv_testament: %d verses in a testament, fewer than --train + --test" % len(vs))
    train = by_class[0][:n_train] + by_class[1][:n_train]
    test = by_class[0][n_train:n_train + n_test] + by_class[1][n_train:n_train + n_test]
    rng.shuffle(train)
    return train, test


class BagClassifier(torch.nn.Module):
    def __init__(self, embedding, classes=2):
        super().__init__()
        self.embedding = embedding
        self.out = torch.nn.Linear(embedding.dim, classes)

    def forward(self, batch_words):
        words = [w for ws in batch_words for w in ws]
        verse = torch.repeat_interleave(torch.arange(len(batch_words)),
                                        torch.tensor([len(ws) for ws in batch_words]))
        rows = self.embedding(words)  # (len(words), dim), requires grad
        bags = torch.zeros(len(batch_words), rows.shape[1]).index_add_(0, verse, rows)
        bags = bags / torch.bincount(verse, minlength=len(batch_words)).unsqueeze(1)
        return self.out(bags)


class LocalEmbedding(torch.nn.Module):
    """The baseline's word vectors: a torch.nn.Embedding over the training vocabulary, with a DynamicEmbedding's
    call signature (a list of words in, their rows out); unseen words share the last row."""

    def __init__(self, vocabulary, dim, scale):
        super().__init__()
        self.index = {w: i for i, w in enumerate(sorted(vocabulary))}
        self.dim = dim
        self.table = torch.nn.Embedding(len(self.index) + 1, dim)
        torch.nn.init.uniform_(self.table.weight, -scale, scale)

    def forward(self, words):
        unseen = len(self.index)
        return self.table(torch.tensor([self.index.get(w, unseen) for w in words]))


def train(model, opt, train_verses, test_verses, args, label):
    """Trains model for args.epochs, printing the test accuracy after each; the final accuracy."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for i in range(0, len(train_verses), args.batch):
            part = train_verses[i:i + args.batch]
            loss = loss_fn(model([w for w, _ in part]), torch.tensor([int(c) for _, c in part]))
            opt.zero_grad()
            loss.backward()  # with a DynamicEmbedding: the Linear layer's gradients to opt, the words' to the bank
            opt.step()
            total += float(loss) * len(part)
        flush = getattr(getattr(model.embedding, "client", None), "flush", None)
        if flush:
            flush()  # DynamicEmbedding(wait=False): every push applied (and checked) before the evaluation
        print("%sepoch %d: train loss %.4f, test accuracy %.4f" % (label, epoch, total / len(train_verses),
                                                                     accuracy(model, test_verses, 256)), flush=True)
    return accuracy(model, test_verses, 256)


def accuracy(model, verses, batch):
    model.eval()  # lookups no longer create rows for unseen words
    right = 0
    with torch.no_grad():
        for i in range(0, len(verses), batch):
            part = verses[i:i + batch]
            pred = model([w for w, _ in part]).argmax(1)
            right += int((pred == torch.tensor([int(c) for _, c in part])).sum())
    model.train()
    return right / len(verses)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bank", required=True, help="kb-server endpoint(s), comma-separated in shard order")
    ap.add_argument("--table", default="kjv_words", help="bank table of word vectors (dropped and re-created)")
    ap.add_argument("--dim", type=int, default=16, help="word vector size (default 16)")
    ap.add_argument("--train", type=int, default=3000, help="training verses per testament (default 3000)")
    ap.add_argument("--test", type=int, default=1000, help="test verses per testament (default 1000)")
    ap.add_argument("--epochs", type=int, default=3, help="passes over the training verses (default 3)")
    ap.add_argument("--batch", type=int, default=32, help="verses per step (default 32)")
    ap.add_argument("--lr", type=float, default=0.2, help="learning rate, bank (adagrad) and Linear (default 0.2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the split, the rows' init and torch (default 1)")
    ap.add_argument("--no-wait", action="store_true",
                    help="backward does not wait for the bank's acknowledgements (DynamicEmbedding(wait=False))")
    ap.add_argument("--baseline", action="store_true",
                    help="then train the same model with a local torch.nn.Embedding, for comparison")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    train_verses, test_verses = balanced_split(kjv_verses(), args.train, args.test, args.seed)
    bank = carls.Client(args.bank.split(","), timeout_ms=10000)
    bank.drop_table(args.table, if_exists=True)
    # Adagrad as torch's: its accumulator starts near 0 (the bank's default is 0.1, which shrinks the first steps).
    bank.create_table(args.table, dim=args.dim, optimizer="adagrad", lr=args.lr, update="lazy", max_age_ms=50,
                      init="uniform", init_scale=0.1, seed=args.seed,
                      settings={"optimizer.initial_accumulator": 1e-6})
    model = BagClassifier(carls.torch.DynamicEmbedding(bank, args.table, args.dim, wait=not args.no_wait))
    start = time.monotonic()
    acc = train(model, torch.optim.Adagrad(model.parameters(), lr=args.lr), train_verses, test_verses, args, "")
    rows = bank.stats(args.table)["tables"][0]["rows"]
    print("test accuracy: %.4f on %d verses (chance 0.5); %d words in the bank; %.1f s"
          % (acc, len(test_verses), rows, time.monotonic() - start), flush=True)
    if args.baseline:
        torch.manual_seed(args.seed)
        vocabulary = {w for words, _ in train_verses for w in words}
        local = BagClassifier(LocalEmbedding(vocabulary, args.dim, 0.1))
        start = time.monotonic()
        acc = train(local, torch.optim.Adagrad(local.parameters(), lr=args.lr), train_verses, test_verses, args,
                    "baseline ")
        print("baseline test accuracy: %.4f (the same model with a local torch.nn.Embedding of %d words); %.1f s"
              % (acc, len(vocabulary), time.monotonic() - start))
    bank.close()


if __name__ == "__main__":
    main()
