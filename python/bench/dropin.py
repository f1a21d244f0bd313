#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""kiln.safetensors against the floors it must keep up with, side by side in one run, medians
and the median of per-round ratios (docs/benchmarks.md, "The safetensors drop-in"):

- warm load of a safetensors file with every page touched (each tensor summed):
  kiln.safetensors.torch.load_file, and safe_open + get_tensor of every tensor, against
  numpy.memmap + torch.from_numpy of the same tensors, summed the same way;
- cold load (the file dropped from the page cache before each run): load_file + sums against a
  plain read() of the file into memory allocated (and touched) beforehand;
- save_file against one write() per tensor plus fsync of the same bytes;
- save_file and load_file of a state dict of many small tensors.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/dropin.py --dir /var/tmp

Files are removed at the end.
"""

import argparse
import json
import os
import statistics
import struct
import time

import numpy as np
import torch

from kiln.safetensors import safe_open
from kiln.safetensors.torch import load_file, save_file
from load import drop_cache  # python/bench/load.py, beside this script


def touch(tensors):
    s = 0.0
    for t in tensors:
        s += float(t.sum())
    return s


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return 8 + n, h


def floor_memmap(path, base, h):
    m = np.memmap(path, dtype=np.uint8, mode="c")  # private, as kiln's: writable tensors
    out = []
    for info in h.values():
        a, b = info["data_offsets"]
        out.append(torch.from_numpy(m[base + a:base + b].view(np.float32).reshape(info["shape"])))
    return out


def kiln_load(path):
    return list(load_file(path).values())


def kiln_get(path):
    with safe_open(path, framework="pt") as f:
        return [f.get_tensor(k) for k in f.keys()]


_READ_BUF = {}


def plain_read(path):
    """The file read once into memory with read() (8 MiB at a time), into a buffer allocated
    and touched before the clock starts, so only the reading is timed."""
    size = os.path.getsize(path)
    view = _READ_BUF.get(size)
    got = 0
    with open(path, "rb", buffering=0) as f:
        while got < size:
            n = f.readinto(view[got:got + (8 << 20)])
            if not n:
                break
            got += n
    return got


def prepare_read(path):
    size = os.path.getsize(path)
    buf = np.ones(size, dtype=np.uint8)  # touched: no page faults in the timed reads
    _READ_BUF[size] = memoryview(buf)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def report(name, rows):
    print(f"\n{name}")
    ref = rows[0][1]
    for label, times in rows:
        ratios = [r / t for r, t in zip(ref, times)]
        print(f"  {label:<42} median {statistics.median(times) * 1e3:9.1f} ms   "
              f"{rows[0][0]} / this: {statistics.median(ratios):.3f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--small", type=int, default=20000)
    args = ap.parse_args()
    path = os.path.join(args.dir, "kiln-dropin.safetensors")
    per = args.size_mib * (1 << 20) // args.tensors // 4
    rng = torch.Generator().manual_seed(0)
    sd = {f"model.layers.{i}.weight": torch.rand(per, generator=rng).reshape(-1, 256)
          for i in range(args.tensors)}
    try:
        save_file(sd, path)
        base, h = header(path)
        print(f"{os.path.getsize(path) / 2**20:.0f} MiB, {len(h)} tensors, {args.rounds} rounds")

        # Warm: every method reads the same cached file; each sums every tensor.
        for fn in (lambda: floor_memmap(path, base, h), lambda: kiln_load(path)):
            touch(fn())
        warm = {"memmap+from_numpy": [], "load_file": [], "safe_open+get_tensor": []}
        for _ in range(args.rounds):
            warm["memmap+from_numpy"].append(timed(lambda: touch(floor_memmap(path, base, h))))
            warm["load_file"].append(timed(lambda: touch(kiln_load(path))))
            warm["safe_open+get_tensor"].append(timed(lambda: touch(kiln_get(path))))
        report("warm, every tensor summed", list(warm.items()))

        prepare_read(path)
        cold = {"plain read()": [], "load_file, summed": [], "memmap+from_numpy, summed": []}
        for _ in range(args.rounds):
            drop_cache(path)
            cold["plain read()"].append(timed(lambda: plain_read(path)))
            drop_cache(path)
            cold["load_file, summed"].append(timed(lambda: touch(kiln_load(path))))
            drop_cache(path)
            cold["memmap+from_numpy, summed"].append(
                timed(lambda: touch(floor_memmap(path, base, h))))
        report("cold (page cache dropped before each)", list(cold.items()))

        # Saving: the same bytes with one write() per tensor and an fsync, to a fresh file.
        other = os.path.join(args.dir, "kiln-dropin-plain.bin")
        blobs = [t.numpy() for t in sd.values()]

        def plain_write():
            fd = os.open(other, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for b in blobs:
                    os.write(fd, b)
                os.fsync(fd)
            finally:
                os.close(fd)

        save = {"write() per tensor + fsync": [], "save_file": []}
        for _ in range(args.rounds):
            save["write() per tensor + fsync"].append(timed(plain_write))
            save["save_file"].append(timed(lambda: save_file(sd, path)))
        report("save", list(save.items()))
        os.remove(other)

        small = {f"model.layers.{i // 10}.mlp.w{i % 10}.weight": torch.rand(16, generator=rng)
                 for i in range(args.small)}
        spath = os.path.join(args.dir, "kiln-dropin-small.safetensors")
        st, lt = [], []
        for _ in range(3):
            st.append(timed(lambda: save_file(small, spath)))
            lt.append(timed(lambda: load_file(spath)))
        print(f"\n{args.small} small tensors: save_file median {statistics.median(st):.3f} s, "
              f"load_file median {statistics.median(lt):.3f} s")
        os.remove(spath)
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
