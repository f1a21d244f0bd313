#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Load every tensor of a KLNT file from Python: kiln.safe_open + get_tensor against
numpy.memmap and numpy.fromfile of the same bytes, cold (page cache dropped for the file) and
warm, interleaved in one run, with medians and ratios.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/load.py --size-mib 1024 --dir /var/tmp

Each method gets every tensor and then reads every byte of it (a uint64 sum), since a zero-copy
get alone costs nothing until the pages are touched; both times are printed. The file is
written with kiln.write_file (one reused buffer, so memory stays at one tensor) and removed at
the end unless --keep.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import kiln


def make_file(path, size, count):
    per = size // count // 4 * 4
    buf = np.random.default_rng(0).integers(0, 1 << 32, per // 4, dtype=np.uint32)
    kiln.write_file(path, [(f"t{i}", "f32", (per // 4,), buf) for i in range(count)])


def drop_cache(path, check=False):
    """Evict path from the page cache (fsync, POSIX_FADV_DONTNEED); with check, fincore must then
    find none of its pages, else the run stops (the Python benches' one eviction)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if not check:
        return
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True)
    if out.returncode == 0 and int(out.stdout.split()[0]) != 0:
        raise SystemExit(f"{path}: {out.stdout.strip()} bytes still cached after eviction")


def touch(arrays):
    total = 0
    for a in arrays:
        total += int(a.view(np.uint8).view(np.uint64).sum(dtype=np.uint64)) if a.nbytes else 0
    return total


def via_kiln(path, layout):
    with kiln.safe_open(path, "np") as f:
        return [f.get_tensor(k) for k in f.keys()]


def via_kiln_shared(path, layout):
    # The read-only shared mapping (copy_on_write=False): what the default's private mapping
    # costs, if anything.
    with kiln.open(path, copy_on_write=False) as d:
        return [t.numpy() for t in d]


def via_memmap(path, layout):
    return [np.memmap(path, np.float32, "r", offset=off, shape=(n,)) for off, n in layout]


def via_fromfile(path, layout):
    return [np.fromfile(path, np.float32, count=n, offset=off) for off, n in layout]


METHODS = [("numpy.memmap", via_memmap), ("kiln.safe_open", via_kiln),
           ("kiln shared map", via_kiln_shared), ("numpy.fromfile", via_fromfile)]


def median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--runs", type=int, default=7, help="runs of every case; medians reported")
    ap.add_argument("--dir", default=None, help="where the file goes (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    fd, path = tempfile.mkstemp(suffix=".klnt", dir=args.dir)
    os.close(fd)
    try:
        make_file(path, args.size_mib << 20, args.tensors)
        with kiln.open(path) as d:
            layout = [(t.file_offset, t.count) for t in d]
            nbytes = sum(t.nbytes for t in d)
        want = touch(via_memmap(path, layout))
        print(f"{args.tensors} f32 tensors, {nbytes / 2**20:.0f} MiB of payload; median of "
              f"{args.runs} interleaved runs; get = every tensor, read = get + every byte "
              f"summed")
        # Interleaved: each run measures every method once, in an order that rotates, so drift
        # in the machine (other load, host cache) falls on all of them alike.
        times = {(name, state): ([], []) for name, _ in METHODS for state in ("cold", "warm")}
        for run in range(args.runs):
            order = METHODS[run % len(METHODS):] + METHODS[:run % len(METHODS)]
            for state in ("cold", "warm"):
                for name, fn in order:
                    if state == "cold":
                        drop_cache(path)
                    else:
                        touch(via_memmap(path, layout))
                    t0 = time.perf_counter()
                    arrays = fn(path, layout)
                    t1 = time.perf_counter()
                    got = touch(arrays)
                    t2 = time.perf_counter()
                    assert got == want, f"{name}: wrong bytes"
                    del arrays
                    times[name, state][0].append(t1 - t0)
                    times[name, state][1].append(t2 - t0)
        print(f"{'method':16} {'state':5} {'get ms':>9} {'read ms':>9} {'read range ms':>15} "
              f"{'GB/s':>7} {'get vs memmap':>14} {'read vs memmap':>15}")
        for state in ("cold", "warm"):
            base_get = median(times["numpy.memmap", state][0])
            base_read = median(times["numpy.memmap", state][1])
            for name, _ in METHODS:
                g, r = (median(x) for x in times[name, state])
                lo, hi = min(times[name, state][1]), max(times[name, state][1])
                spread = f"{lo * 1e3:.0f}-{hi * 1e3:.0f}"
                print(f"{name:16} {state:5} {g * 1e3:9.2f} {r * 1e3:9.2f} {spread:>15} "
                      f"{nbytes / r / 1e9:7.2f} {g / base_get:14.2f} {r / base_read:15.2f}")
        print("(in a VM the host may still cache a 'cold' file; cold here means "
              "POSIX_FADV_DONTNEED on the guest's page cache)")
    finally:
        if not args.keep:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
