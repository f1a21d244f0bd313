#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""kiln.torch.iter_load against kiln.torch.load and a safe_open/get_tensor/clone loop (what
vLLM's default iterator does for owned tensors; here through kiln's drop-in, since the real
safetensors package is not installable on these machines), warm and cold, rounds interleaved,
each call in a fresh process: time, GB/s, and peak RSS above the process's baseline (VmHWM,
reset with /proc/self/clear_refs before the call). Then the per-tensor Python cost of the stream
on a 20,000-tensor file: iter_load's time per tensor less that of the one C call that reads the
same tensors into one block (kiln's own cost), medians of the rounds.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/iter_load.py --dir /var/tmp

Cold: the file is evicted (fsync + POSIX_FADV_DONTNEED) and fincore checked to show 0 pages
before each cold call. Files are removed at the end.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from load import drop_cache  # python/bench/load.py, beside this script

MIB = 1 << 20


def make_file(path, size, n_small):
    """A 1 GiB-class safetensors file shaped like a model: one embedding (1/16 of the file),
    blocks of 4-16 MiB matrices, and n_small small vectors (norms, biases)."""
    import torch

    import kiln.safetensors.torch as st

    g = torch.Generator().manual_seed(0)
    t = {"embed.weight": torch.randn(size // 16 // 2 // 4096, 4096, generator=g).half()}
    left, i = size - t["embed.weight"].numel() * 2, 0
    while left > 64 * MIB:
        for part, rows in (("q", 1024), ("k", 512), ("o", 1024), ("up", 2048)):
            n = rows * 4096
            t[f"layers.{i}.{part}.weight"] = torch.randn(n, generator=g).half().reshape(rows, 4096)
            left -= n * 2
        i += 1
    for k in range(n_small):
        t[f"norms.{k}.weight"] = torch.randn(256, generator=g).half()
    st.save_file(t, path)


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def child(mode, path, window):
    """One call in this fresh process: prints seconds and peak RSS above the baseline."""
    import torch

    import kiln.safetensors
    import kiln.torch

    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    t0 = time.perf_counter()
    n = 0
    if mode == "iter":
        for _name, t in kiln.torch.iter_load(path, window_bytes=window):
            n += t.numel()
            del t
    elif mode == "dict":
        sd = kiln.torch.load(path)
        n = sum(t.numel() for t in sd.values())
        del sd
    elif mode == "loop":
        with kiln.safetensors.safe_open(path, framework="pt") as f:
            for k in f.keys():
                t = f.get_tensor(k).clone()
                n += t.numel()
                del t
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak": status("VmHWM") - base, "n": n}))
    del torch


def overhead(path, rounds):
    """Per tensor: iter_load's time less the one C call reading the same tensors (warm)."""
    import kiln
    import kiln.torch

    rows = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = sum(1 for _ in kiln.torch.iter_load(path))
        t1 = time.perf_counter()
        with kiln.open(path, directory_only=True) as d:
            t2 = time.perf_counter()
            r = d.load(list(range(len(d))), arena=True)
            t3 = time.perf_counter()
        del r
        rows.append(((t1 - t0) / n * 1e6, (t3 - t2) / n * 1e6))
    return n, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--window-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], int(a.child[2]))
    work = tempfile.mkdtemp(dir=a.dir, prefix="kiln-iter-")
    path = os.path.join(work, "m.safetensors")
    small = os.path.join(work, "20k.safetensors")
    try:
        make_file(path, a.size_mib * MIB, 256)
        import kiln

        with kiln.open(path, directory_only=True) as d:
            sizes = [t.nbytes for t in d]
        size = sum(sizes)
        print(f"{size / MIB:.0f} MiB of payload in {len(sizes)} tensors (largest "
              f"{max(sizes) / MIB:.0f} MiB), window {a.window_mib} MiB, {a.rounds} rounds")
        modes = ["iter", "dict", "loop"]
        got = {(m, c): [] for m in modes for c in ("warm", "cold")}
        for r in range(a.rounds):
            for cache in ("cold", "warm"):
                k = r % len(modes)
                for mode in modes[k:] + modes[:k]:
                    if cache == "cold":
                        drop_cache(path, check=True)
                    else:
                        with open(path, "rb") as f:  # warm: every page cached
                            while f.read(64 * MIB):
                                pass
                    out = subprocess.run([sys.executable, __file__, "--child", mode, path,
                                          str(a.window_mib * MIB)],
                                         capture_output=True, text=True, check=True)
                    got[(mode, cache)].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for cache in ("warm", "cold"):
            print(f"{cache}:")
            for mode in modes:
                rows = got[(mode, cache)]
                sec = statistics.median(x["seconds"] for x in rows)
                peak = statistics.median(x["peak"] for x in rows)
                print(f"  {mode:5s} median {sec:6.3f} s  {size / sec / 1e9:5.2f} GB/s  "
                      f"peak RSS above baseline {peak / MIB:7.1f} MiB "
                      f"[{min(x['peak'] for x in rows) / MIB:.1f}-"
                      f"{max(x['peak'] for x in rows) / MIB:.1f}]")
            it = got[("iter", cache)]
            for other in ("dict", "loop"):
                ratios = [o["seconds"] / i["seconds"] for i, o in zip(it, got[(other, cache)])]
                print(f"  iter vs {other}: {statistics.median(ratios):.2f}x "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}] (its time over iter's, per round)")
        bound = a.window_mib * MIB + max(sizes) + 32 * MIB
        print(f"bound for iter's peak: window + largest tensor + 32 MiB = {bound / MIB:.0f} MiB")
        os.unlink(path)

        import torch

        import kiln.safetensors.torch as st

        st.save_file({f"t.{i}": torch.full((128,), float(i % 7)).half() for i in range(20000)},
                     small)
        n, rows = overhead(small, max(7, a.rounds))
        per = statistics.median(x - y for x, y in rows)
        print(f"{n} tensors of 256 bytes, warm: iter_load "
              f"{statistics.median(x for x, _ in rows):.2f} us per tensor, the C call alone "
              f"{statistics.median(y for _, y in rows):.2f}: Python's cost {per:.2f} us per "
              f"tensor (median of {len(rows)} rounds)")
    finally:
        for p in (path, small):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(work)


if __name__ == "__main__":
    main()
