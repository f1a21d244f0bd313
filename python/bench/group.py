#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Read once per group against each rank reading alone (docs/benchmarks.md, "Read once"):
world ranks (processes, gloo on 127.0.0.1), each with its own cold copy of a KLNT file, time from
a barrier until every rank holds every tensor (the next barrier), and the bytes each read from
storage (/proc/self/io read_bytes), rounds rotating the modes. The stream mode is
kiln.torch.iter_load(group=True), consuming each tensor as it comes. A third mode, exchange, runs the
group's all-gathers of the same bytes with no reads: the interconnect's floor under the group.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/group.py --size-mib 1024 --dir /var/tmp

Files are removed at the end.
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from load import drop_cache  # python/bench/load.py, beside this script


def read_bytes():
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


# group: kiln.torch.load(group=True); stream: kiln.torch.iter_load(group=True) with a 64 MiB
# window, each tensor dropped as it comes; alone: each rank loads the whole file itself;
# exchange: the all-gathers alone.
MODES = ["group", "stream", "alone", "exchange"]


def consume(it):
    n = 0
    for _name, t in it:
        n += t.numel()
    return n


def rank_main(path, rounds):
    import torch.distributed as dist

    import kiln

    import torch

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    with kiln.open(path, directory_only=True) as d:
        payload = sum(t.nbytes for t in d)
    chunk = 8 << 20  # kiln_group_load's default, with its 256-byte head per slot
    slots = (payload + chunk - 1) // chunk

    def exchange():
        mine = torch.zeros(chunk + 256, dtype=torch.uint8)
        every = torch.empty(world * (chunk + 256), dtype=torch.uint8)
        for _ in range(1 + (slots + world - 1) // world):  # the fingerprints, then the rounds
            dist.all_gather(list(every.chunk(world)), mine)
        return every

    modes = MODES
    rows = []
    for r in range(rounds):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            drop_cache(path)
            dist.barrier()
            before, t0 = read_bytes(), time.perf_counter()
            sd = (kiln.torch.load(path, group=True) if mode == "group" else
                  consume(kiln.torch.iter_load(path, group=True, window_bytes=64 << 20))
                  if mode == "stream" else
                  kiln.torch.load(path) if mode == "alone" else exchange())
            dist.barrier()
            t = time.perf_counter() - t0
            rows.append({"mode": mode, "seconds": t, "read": read_bytes() - before})
            del sd
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "rows": rows}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--rank-main", nargs=2)
    a = ap.parse_args()
    if a.rank_main:
        return rank_main(a.rank_main[0], int(a.rank_main[1]))
    work = tempfile.mkdtemp(dir=a.dir, prefix="kiln-group-")
    try:
        src = os.path.join(work, "m.klnt")
        here = os.path.dirname(os.path.abspath(__file__))
        klnt = os.environ.get("KLNT", os.path.join(os.path.dirname(os.path.dirname(here)),
                                                    "build", "klnt"))
        subprocess.run([klnt, "gen", src, "--tensors", "300", "--bytes", f"{a.size_mib}M",
                        "--no-sync"], check=True, stdout=subprocess.DEVNULL)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(a.world):
            copy = os.path.join(work, f"rank{r}.klnt")
            shutil.copy(src, copy)
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", copy,
                                           str(a.rounds)], env=env, stdout=subprocess.PIPE))
        os.unlink(src)
        out = [json.loads(p.communicate()[0].decode().strip().splitlines()[-1]) for p in procs]
        size = os.path.getsize(os.path.join(work, "rank0.klnt"))
        print(f"{a.size_mib} MiB KLNT file ({size} bytes), world {a.world}, gloo, cold copies, "
              f"{a.rounds} rounds")
        for mode in MODES:
            times = [out[0]["rows"][i]["seconds"] for i in range(len(out[0]["rows"]))
                     if out[0]["rows"][i]["mode"] == mode]
            reads = [sum(o["rows"][i]["read"] for o in out) for i in range(len(out[0]["rows"]))
                     if out[0]["rows"][i]["mode"] == mode]
            print(f"  {mode:6s} median {statistics.median(times):7.3f} s  "
                  f"{size / 1e9 / statistics.median(times):5.2f} GB/s of the file  "
                  f"read from storage by all ranks: {statistics.median(reads) / size:.2f}x the file")
        rows = out[0]["rows"]
        for other in MODES[1:]:
            ratios = []
            for i in range(0, len(rows), len(MODES)):
                one = {x["mode"]: x["seconds"] for x in rows[i:i + len(MODES)]}
                ratios.append(one[other] / one["group"])
            print(f"  group vs {other}: {statistics.median(ratios):.2f}x (median of the rounds' "
                  f"{other} time over group time)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
