#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What the disk sees during a cold load: for each way of reading a file (kiln's READ and URING
sources into fresh owned memory, a plain pread loop into one reused 4 MiB buffer, the same into
fresh memory of the file's size), the file is evicted (fincore checked), read once, and the
block device's own counters (/sys/block/DEV/stat) are differenced around the read: read
requests, their mean size and latency, and the mean number in flight (time in queue over
wall time). Rounds interleave the ways in a new random order; medians are printed, with each
way's time over READ's from the same round.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/cold_queue.py FILE [--rounds 7]

docs/benchmarks.md, "Cold: io_uring against pread".
"""

import argparse
import mmap
import os
import random
import statistics
import time

import kiln
from load import drop_cache  # python/bench/load.py, beside this script

MIB = 1 << 20


def device_stat(path):
    """The /sys/block/.../stat file of the disk holding path (a partition's own counters)."""
    st = os.stat(path)
    return f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"


def plain(path, fresh):
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if fresh:  # as an owned load: memory of the file's size, huge pages advised
            buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            buf.madvise(mmap.MADV_HUGEPAGE)
            view, at = memoryview(buf), 0
            while at < size:
                n = os.preadv(fd, [view[at:at + 4 * MIB]], at)
                if n <= 0:
                    break
                at += n
            view.release()
            buf.close()
        else:
            buf = bytearray(4 * MIB)
            while os.readv(fd, [buf]) > 0:
                pass
    finally:
        os.close(fd)


WAYS = {
    "read": lambda p: kiln.open(p, source="read").close(),
    "uring": lambda p: kiln.open(p, source="uring").close(),
    "plain": lambda p: plain(p, False),
    "plain-fresh": lambda p: plain(p, True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    stat = device_stat(a.file)
    rows = {w: [] for w in WAYS}
    for _ in range(a.rounds):
        order = list(WAYS)
        random.shuffle(order)
        for w in order:
            drop_cache(a.file, check=True)
            s0 = [int(x) for x in open(stat).read().split()]
            t0 = time.perf_counter()
            WAYS[w](a.file)
            t = time.perf_counter() - t0
            d = [y - x for x, y in zip(s0, [int(x) for x in open(stat).read().split()])]
            ios, sectors, ticks, queue = d[0], d[2], d[3], d[10]
            rows[w].append((t, ios, sectors * 512 / max(ios, 1) / 1024, ticks / max(ios, 1),
                            queue / 1000 / t))
    size = os.path.getsize(a.file)
    print(f"{a.file}: {size} bytes, cold, {a.rounds} rounds, device counters of {stat}")
    for w, v in rows.items():
        med = [statistics.median(x[i] for x in v) for i in range(5)]
        ratio = statistics.median(rows["read"][i][0] / v[i][0] for i in range(a.rounds))
        print(f"  {w:12s} {med[0]:6.3f} s  {size / 1e9 / med[0]:5.2f} GB/s  read/this {ratio:4.2f}x"
              f"  requests {med[1]:5.0f} of {med[2]:5.0f} KiB, {med[3]:5.1f} ms each,"
              f" {med[4]:5.1f} in flight")


if __name__ == "__main__":
    main()
