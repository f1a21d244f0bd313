# SPDX-License-Identifier: MIT
"""kiln.torch.load(group=...) over torch.distributed with gloo on 127.0.0.1: world 2 and 4 in
separate processes, each rank with its own cold copy of the model. The same tensors as a
one-process load for KLNT, a sharded safetensors checkpoint and GGUF; tp shares equal to
torch.tensor_split; the bytes the ranks read from storage add up to the file once (kiln's
counters and /proc/self/io); different copies and a rank that dies give errors, not a hang."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")

WORKER = textwrap.dedent("""
    import datetime, hashlib, json, os, sys, time
    import torch, torch.distributed as dist
    import kiln
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path, out = sys.argv[1], sys.argv[2]
    tp = json.loads(os.environ.get("KILN_TEST_TP", "null"))
    die_at = int(os.environ.get("KILN_TEST_DIE_AT", "0"))
    stall_at = int(os.environ.get("KILN_TEST_STALL_AT", "0"))
    if (die_at or stall_at) and rank == 1:
        real, calls = dist.all_gather, [0]
        def dying(*a, **k):
            calls[0] += 1
            if calls[0] == die_at:
                os._exit(9)  # a rank that dies mid-load, sockets and all
            if calls[0] == stall_at:
                time.sleep(12)  # alive, connected, silent: only the timeout can tell
                os._exit(9)
            return real(*a, **k)
        dist.all_gather = dying
    timeout = float(os.environ.get("KILN_TEST_PG_TIMEOUT", "30"))
    # A file store for the rendezvous: no port to pick, so none another process can take first.
    dist.init_process_group("gloo", init_method="file://" + os.environ["KILN_TEST_RDV"],
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    # A cold copy: nothing of it in the page cache, as on a node of its own.
    for root, _, files in os.walk(os.path.dirname(path)):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    def io():
        for line in open("/proc/self/io"):
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    before, stats = io(), {}
    start = time.monotonic()
    try:
        if os.environ.get("KILN_TEST_ITER"):
            # The stream: every rank the same sequence, 4 MiB windows, each a group read.
            it = kiln.torch.iter_load(path, group=dist.group.WORLD, window_bytes=4 << 20)
            sd = dict(it)
            stats = {"bytes_read": it.bytes_read, "bytes_received": it.bytes_received,
                     "batches": len(it._batches)}
        else:
            sd = kiln.torch.load(path, group=dist.group.WORLD, tp=tp, stats=stats,
                                 verify=bool(os.environ.get("KILN_TEST_VERIFY")))
    except Exception as e:
        with open(out, "w") as f:
            json.dump({"error": type(e).__name__ + ": " + str(e),
                       "seconds": time.monotonic() - start}, f)
        os._exit(3)  # no teardown of a group whose peer may be gone (gloo aborts in it)
    read = io() - before
    digest = {str(k): [hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy()
                                      .tobytes() if v.dtype != torch.uint8 else
                                      v.contiguous().view(-1).numpy().tobytes()).hexdigest(),
                       list(v.shape), str(v.dtype)] for k, v in sd.items()}
    json.dump({"tensors": digest, "stats": stats, "read_bytes": read}, open(out, "w"))
    dist.destroy_process_group()
""")


def _digest(sd):
    out = {}
    for k, v in sd.items():
        flat = v.contiguous().view(-1)
        b = (flat if v.dtype == torch.uint8 else flat.view(torch.uint8)).numpy().tobytes()
        out[str(k)] = [hashlib.sha256(b).hexdigest(), list(v.shape), str(v.dtype)]
    return out


def _readahead_bytes(path):
    """The read-ahead window of the block device holding path (its queue's read_ahead_kb; a
    partition's is its disk's); 8 MiB when it cannot be told."""
    st = os.stat(path)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (os.path.join(dev, "queue"), os.path.join(dev, "..", "queue")):
        try:
            with open(os.path.join(q, "read_ahead_kb")) as f:
                return int(f.read()) << 10
        except (OSError, ValueError):
            pass
    return 8 << 20


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, source, world, *, name, tp=None, die_at=0, stall_at=0, pg_timeout=30,
         other=None, stream=False, verify=False):
    """Each rank on its own copy of `source` (a file, or the directory holding it); returns the
    ranks' (exit status, result)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = []
    for r in range(world):
        d = tmp_path / f"{name}-rank{r}"
        src = other if (other and r == 1) else source
        if os.path.isdir(os.path.dirname(src)) and src.endswith(".json"):
            shutil.copytree(os.path.dirname(src), d)
            path = str(d / os.path.basename(src))
        else:
            d.mkdir()
            path = str(d / os.path.basename(source))
            shutil.copy(src, path)
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   KILN_TEST_RDV=str(tmp_path / f"rdv-{name}"), KILN_TEST_TP=json.dumps(tp),
                   KILN_TEST_DIE_AT=str(die_at), KILN_TEST_STALL_AT=str(stall_at),
                   KILN_TEST_PG_TIMEOUT=str(pg_timeout), KILN_TEST_ITER="1" if stream else "",
                   KILN_TEST_VERIFY="1" if verify else "")
        out = tmp_path / f"{name}-{r}.json"
        procs.append((subprocess.Popen([sys.executable, str(script), path, str(out)], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT), out))
    results = []
    for p, out in procs:
        try:
            text, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            pytest.fail("a rank hung")
        res = json.loads(out.read_text()) if out.exists() else {"output": text.decode()}
        results.append((p.returncode, res))
    return results


@pytest.fixture(scope="module")
def klnt(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("g") / "m.klnt")
    g = torch.Generator().manual_seed(7)
    t = {f"blk.{i}.w": torch.randn(256, 1024 + 8 * i, generator=g) for i in range(24)}
    t["emb"] = torch.randn(4099, 512, generator=g).to(torch.bfloat16)
    t["odd"] = torch.arange(0, 1001, dtype=torch.int16)  # gloo refuses int16; bytes go through
    t["empty"] = torch.zeros(0, 3)
    kiln.save_file(t, p)
    return p


@pytest.mark.parametrize("world", [2, 4])
def test_klnt_same_as_one_process_read_once(tmp_path, klnt, world):
    want = _digest(kiln.torch.load(klnt))
    results = _run(tmp_path, klnt, world, name="k")
    size = os.path.getsize(klnt)
    payload = sum(v.numel() * v.element_size() for v in kiln.torch.load(klnt).values())
    read = [res["stats"]["bytes_read"] for rc, res in results]
    for rc, res in results:
        assert rc == 0, res
        assert res["tensors"] == want
        assert res["stats"]["bytes_read"] + res["stats"]["bytes_received"] == payload
    assert sum(read) == payload  # kiln's counters: each byte once
    storage = sum(res["read_bytes"] for _, res in results)
    # Once, not world times. Slack: 2 MiB for what else the processes read in the meantime (a
    # lazily imported module's pages), and the kernel's read-ahead past the end of each rank's
    # share, up to twice the device's window per rank (8 MiB on this project's VMs).
    slack = (2 << 20) + world * 2 * _readahead_bytes(klnt)
    assert 0.9 * size <= storage <= 1.1 * size + slack, (storage, size, slack)


def test_iter_load_with_a_group_reads_once(tmp_path, klnt):
    """kiln.torch.iter_load(group=): each batch a group read, every rank the same stream."""
    want = _digest(kiln.torch.load(klnt))
    results = _run(tmp_path, klnt, 2, name="i", stream=True)
    payload = sum(v.numel() * v.element_size() for v in kiln.torch.load(klnt).values())
    for rc, res in results:
        assert rc == 0, res
        assert res["tensors"] == want
        assert res["stats"]["batches"] > 4
        assert res["stats"]["bytes_read"] + res["stats"]["bytes_received"] == payload
    assert sum(res["stats"]["bytes_read"] for _, res in results) == payload
    size = os.path.getsize(klnt)
    storage = sum(res["read_bytes"] for _, res in results)
    slack = (2 << 20) + 2 * 2 * _readahead_bytes(klnt)
    assert 0.9 * size <= storage <= 1.1 * size + slack, (storage, size, slack)


def test_iter_load_with_a_group_meets_a_hostile_peer(tmp_path, klnt):
    """The stream's group reads are kiln_group_load's: a copy with other bytes is named, and a
    rank that dies mid-stream fails the others at once, not at the timeout."""
    other = str(tmp_path / "other.klnt")
    sd = kiln.torch.load(klnt)
    sd["blk.3.w"] = sd["blk.3.w"] + 1
    kiln.save_file(sd, other)
    for rc, res in _run(tmp_path, klnt, 2, name="ibytes", other=other, stream=True):
        assert rc == 3, res
        assert "the ranks opened different checkpoints" in res["error"], res
        assert '"blk.3.w"' in res["error"], res
    results = _run(tmp_path, klnt, 2, name="idead", die_at=5, stream=True)
    rc0, res0 = results[0]
    assert rc0 == 3 and "error" in res0, res0
    assert "kiln.torch.iter_load(group=): rank 0 of 2: the all-gather of" in res0["error"], res0
    assert res0["seconds"] < 10, res0
    assert results[1][0] == 9


@pytest.mark.parametrize("source", ["tiny-sharded/model.safetensors.index.json",
                                    "tiny-llama.gguf"])
def test_stock_formats(tmp_path, source):
    path = os.path.join(SAMPLES, source)
    want = _digest(kiln.torch.load(path))
    for rc, res in _run(tmp_path, path, 2, name="s"):
        assert rc == 0, res
        assert res["tensors"] == want


def test_tp_shares_are_tensor_split(tmp_path, klnt):
    tp = {"blk.*": 1, "emb": 0}
    full = kiln.torch.load(klnt)
    world = 4
    results = _run(tmp_path, klnt, world, name="tp", tp=tp)
    for r, (rc, res) in enumerate(results):
        assert rc == 0, res
        for k, v in full.items():
            axis = 1 if k.startswith("blk.") else 0 if k == "emb" else None
            want = v if axis is None else torch.tensor_split(v, world, dim=axis)[r]
            assert res["tensors"][k] == _digest({k: want})[k], (r, k)
        shares = sum(torch.tensor_split(v, world, dim=1 if k.startswith("blk.") else 0)[r]
                     .numel() * v.element_size() for k, v in full.items()
                     if k.startswith("blk.") or k == "emb")
        assert res["stats"]["tp_bytes_read"] == shares  # only its shares


def test_different_copies_are_found(tmp_path, klnt):
    other = str(tmp_path / "other.klnt")
    sd = kiln.torch.load(klnt)
    sd["odd"] = sd["odd"][:-1]
    kiln.save_file(sd, other)
    results = _run(tmp_path, klnt, 2, name="diff", other=other)
    for rc, res in results:
        assert rc == 3, res
        assert "rank 1 opened a different model from rank 0" in res["error"], res


def test_same_headers_other_bytes_are_found(tmp_path, klnt):
    # Every name, dtype, shape and offset alike, the bytes of one tensor not: each rank would
    # have half of each checkpoint.
    other = str(tmp_path / "other.klnt")
    sd = kiln.torch.load(klnt)
    sd["blk.3.w"] = sd["blk.3.w"] + 1
    kiln.save_file(sd, other)
    with kiln.open(klnt) as a, kiln.open(other) as b:
        assert a.info["directory_bytes"] == b.info["directory_bytes"]
    results = _run(tmp_path, klnt, 2, name="bytes", other=other)
    for rc, res in results:
        assert rc == 3, res
        assert "the ranks opened different checkpoints" in res["error"], res
        assert '"blk.3.w"' in res["error"], res


def test_verify_checks_what_each_rank_reads_and_receives(tmp_path, klnt):
    """verify=True with a group: each rank checks its reads and every chunk it receives
    against its copy's own digest table (kiln.save_file writes one); a rank with another
    checkpoint of the same headers is found by those digests, naming the tensor."""
    want = _digest(kiln.torch.load(klnt))
    payload = sum(v.numel() * v.element_size() for v in kiln.torch.load(klnt).values())
    for rc, res in _run(tmp_path, klnt, 2, name="v", verify=True):
        assert rc == 0, res
        assert res["tensors"] == want
        assert res["stats"]["bytes_read"] + res["stats"]["bytes_received"] == payload
        assert res["stats"]["bytes_verified"] >= res["stats"]["bytes_received"], res
    other = str(tmp_path / "other.klnt")
    sd = kiln.torch.load(klnt)
    sd["blk.3.w"] = sd["blk.3.w"] + 1
    kiln.save_file(sd, other)
    results = _run(tmp_path, klnt, 2, name="vo", other=other, verify=True)
    for rc, res in results:
        assert rc == 3, res
    # The rank that finds it says CorruptError; the other hears of it at the next exchange.
    assert any(res["error"].startswith("CorruptError: a chunk received from another rank")
               for _, res in results), results
    assert all("differs from its digest" in res["error"] for _, res in results), results


def test_a_dead_rank_is_an_error_not_a_hang(tmp_path, klnt):
    # Its sockets close with it: the others know at once, not at the timeout (30 s here).
    results = _run(tmp_path, klnt, 2, name="dead", die_at=3)
    rc0, res0 = results[0]
    assert rc0 == 3 and "error" in res0, res0
    assert "rank 0 of 2: the all-gather of round 2 of chunks failed" in res0["error"], res0
    assert res0["seconds"] < 10, res0
    assert results[1][0] == 9


def test_a_stalled_rank_fails_the_others_within_the_timeout(tmp_path, klnt):
    # A rank that stops answering without closing its sockets: the others fail once the
    # process group's timeout (3 s here) passes, long before the stalled rank would go on.
    results = _run(tmp_path, klnt, 2, name="stall", stall_at=3, pg_timeout=3)
    rc0, res0 = results[0]
    assert rc0 == 3 and "error" in res0, res0
    assert "rank 0 of 2: the all-gather of round 2 of chunks failed" in res0["error"], res0
    assert "Timed out" in res0["error"], res0
    assert res0["seconds"] < 10, res0


def test_the_readme_launch(tmp_path, klnt):
    # The README's example, launched as it says (torch.distributed.run, two ranks here).
    script = tmp_path / "serve.py"
    out = tmp_path / "out"
    script.write_text(textwrap.dedent(f"""
        import datetime, hashlib, json, sys
        import torch, torch.distributed as dist, kiln
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        sd = kiln.torch.load({klnt!r}, group=dist.group.WORLD, tp={{"blk.*": 0}})
        rank = dist.get_rank()
        json.dump({{k: list(v.shape) for k, v in sd.items()}},
                  open({str(out)!r} + str(rank), "w"))
        dist.destroy_process_group()
    """))
    port = _free_port()
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--redirects", "1", "--tee", "1", "--master_port", str(port),
                        "--log_dir", str(tmp_path / "logs"), str(script)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-2000:]
    full = kiln.torch.load(klnt)
    for r in range(2):
        shapes = json.loads((tmp_path / f"out{r}").read_text())
        for k, v in full.items():
            want = torch.tensor_split(v, 2, dim=0)[r] if k.startswith("blk.") else v
            assert shapes[k] == list(want.shape), (r, k)
