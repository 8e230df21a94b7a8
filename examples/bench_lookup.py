#!/usr/bin/env python3
"""What the Python skin costs: Client.lookup of B keys against the C client's call for the same keys, in the
same process, against the same kb-server, alternating the two so that drift hits both alike.

The C figure is kb_ffi_lookup (libcarls_client.so: kb_cluster_lookup_ex and the copy out) called with
arguments built once beforehand: the C client's work plus one cffi call. The Python figure is
carls.Client.lookup(table, keys) from a list of str: the keys' encoding, the output array, the call and the
error check. Prints the median and mean microseconds per call of each and their ratio.

    PYTHONPATH=python python3 examples/bench_lookup.py --bank tcp://127.0.0.1:7070
"""
import argparse
import random
import statistics
import time

import numpy as np

import carls
from carls._ffi import ffi, lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", required=True, help="kb-server endpoint")
    ap.add_argument("--table", default="bench_py", help="table to create and fill (default bench_py)")
    ap.add_argument("--dim", type=int, default=64, help="row size (default 64, as kb-bench)")
    ap.add_argument("--batch", type=int, default=256, help="keys per lookup (default 256)")
    ap.add_argument("--rows", type=int, default=20000, help="rows in the table (default 20000)")
    ap.add_argument("--calls", type=int, default=2000, help="timed calls of each kind (default 2000)")
    args = ap.parse_args()

    bank = carls.Client(args.bank, timeout_ms=10000)
    bank.drop_table(args.table, if_exists=True)
    bank.create_table(args.table, dim=args.dim)
    keys = ["key%d" % i for i in range(args.rows)]
    rng = np.random.default_rng(1)
    for i in range(0, args.rows, 1000):
        bank.put(args.table, keys[i:i + 1000], rng.standard_normal((len(keys[i:i + 1000]), args.dim), np.float32))
    random.seed(1)
    batches = [random.sample(keys, args.batch) for _ in range(64)]
    # the C call's arguments, built once
    prepared = []
    for b in batches:
        data = "\0".join(b).encode()
        out = np.empty((args.batch, args.dim), np.float32)
        prepared.append((data, len(data), ffi.from_buffer("float[]", out)))
    table = args.table.encode()
    h = bank._h

    def c_call(i):
        data, size, out = prepared[i % len(prepared)]
        t = time.perf_counter_ns()
        rc = lib.kb_ffi_lookup(h, table, data, size, ffi.NULL, args.batch, args.dim, False, out, ffi.NULL,
                               ffi.NULL, ffi.NULL)
        t = time.perf_counter_ns() - t
        assert rc == 0
        return t

    def py_call(i):
        b = batches[i % len(batches)]
        t = time.perf_counter_ns()
        bank.lookup(args.table, b)
        return time.perf_counter_ns() - t

    for i in range(200):  # warm up both paths
        c_call(i)
        py_call(i)
    c_ns, py_ns = [], []
    for i in range(args.calls):
        if i % 2:
            c_ns.append(c_call(i))
            py_ns.append(py_call(i))
        else:
            py_ns.append(py_call(i))
            c_ns.append(c_call(i))
    # Python's own part alone: encode keys, allocate the array, call nothing
    enc_ns = []
    for i in range(args.calls):
        b = batches[i % len(batches)]
        t = time.perf_counter_ns()
        carls._keys(b)
        np.empty((args.batch, args.dim), np.float32)
        enc_ns.append(time.perf_counter_ns() - t)
    cm, pm = statistics.median(c_ns) / 1e3, statistics.median(py_ns) / 1e3
    print("lookup of %d keys, dim %d, %d calls each, %s" % (args.batch, args.dim, args.calls, args.bank))
    print("  C (kb_ffi_lookup):      median %8.1f us   mean %8.1f us" % (cm, statistics.mean(c_ns) / 1e3))
    print("  Python (Client.lookup): median %8.1f us   mean %8.1f us" % (pm, statistics.mean(py_ns) / 1e3))
    print("  Python's own work (keys + array, no call): median %.1f us" % (statistics.median(enc_ns) / 1e3))
    print("  ratio Python / C (medians): %.3f" % (pm / cm))
    bank.drop_table(args.table)
    bank.close()


if __name__ == "__main__":
    main()
