# SPDX-License-Identifier: MIT
"""kiln.torch.load and Dir.load: the load pipeline from Python. The same bytes as the file for
every format, tensors that own their memory, the order asked for, progress and its errors,
placement by pattern, and what is refused."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")


def _raw(x):
    """A tensor's bytes as a flat uint8 tensor."""
    x = x.contiguous().reshape(-1)
    return x if x.dtype == torch.uint8 else x.view(torch.uint8)


def _same_as_file(sd, path):
    with kiln.open(path) as d:
        assert len(sd) == len(d)
        for i in range(len(d)):
            t = d[i]
            key = t.name if t.name is not None else i
            want = torch.from_dlpack(t.to_dlpack(raw=True))
            assert torch.equal(_raw(sd[key]), want), key
            if t.dtype in ("f32", "f16", "bf16", "i64", "i32", "i8", "u8", "bool"):
                assert tuple(sd[key].shape) == t.shape, key


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "m.klnt")
    g = torch.Generator().manual_seed(3)
    tensors = {f"blk.{i}.w": torch.randn(64 + i, 300, generator=g) for i in range(12)}
    tensors["emb"] = torch.randn(3000, 700, generator=g).to(torch.bfloat16)  # 4 MiB: huge
    tensors["mask"] = torch.tensor([True, False, True])
    tensors["ids"] = torch.arange(-5, 5, dtype=torch.int64)
    tensors["empty"] = torch.zeros(0, 7, dtype=torch.float16)
    kiln.save_file(tensors, p)
    return p


def test_same_bytes_dtypes_and_shapes(path):
    for threads in (None, 1, 3):
        sd = kiln.torch.load(path, threads=threads)
        _same_as_file(sd, path)
        assert sd["emb"].dtype == torch.bfloat16 and tuple(sd["emb"].shape) == (3000, 700)
        assert sd["mask"].dtype == torch.bool and sd["mask"].tolist() == [True, False, True]
        assert sd["ids"].tolist() == list(range(-5, 5))
        assert tuple(sd["empty"].shape) == (0, 7)


def test_tensors_own_their_memory(path, tmp_path):
    sd = kiln.torch.load(path)
    os.unlink(path)  # nothing maps the file
    gc.collect()
    w = sd["blk.3.w"]
    assert w.storage().size() == w.numel()  # a storage of its own, not the whole block
    w.add_(1)  # writable, and only this tensor changes
    assert not torch.equal(sd["blk.3.w"], sd["blk.4.w"][:67])
    out = str(tmp_path / "one.pt")
    torch.save(sd["ids"], out)
    assert os.path.getsize(out) < 4096  # one tensor's bytes, not the block's
    keep = sd["emb"]
    del sd
    gc.collect()
    assert float(keep.float().abs().sum()) > 0  # the block lives while a tensor does


def test_stock_formats():
    for p in (os.path.join(SAMPLES, "tiny-sharded", "model.safetensors.index.json"),
              os.path.join(SAMPLES, "tiny-llama.gguf")):
        sd = kiln.torch.load(p, threads=2)
        _same_as_file(sd, p)


def test_gguf_quantized_blocks_come_as_bytes():
    p = os.path.join(SAMPLES, "tiny-llama.gguf")
    sd = kiln.torch.load(p)
    with kiln.open(p) as d:
        opaque = [d[i] for i in range(len(d)) if d[i].layout is not None]
        for t in opaque:
            assert sd[t.name].dtype == torch.uint8 and tuple(sd[t.name].shape) == (t.nbytes,)


def test_order_and_progress(path):
    seen = []
    sd = kiln.torch.load(path, order=["emb", "blk.11.w", "emb"],
                         progress=lambda done, total: seen.append((done, total)))
    _same_as_file(sd, path)
    assert list(sd) == list(kiln.torch.load(path))  # the dict is in file order
    assert seen and seen[-1][0] == seen[-1][1]
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    with pytest.raises(KeyError, match="nope"):
        kiln.torch.load(path, order=["nope"])


def test_dir_load_announces_in_the_order_given(path):
    with kiln.open(path) as d:
        order = ["emb", "blk.0.w", "ids", "blk.11.w"]
        bufs = [np.empty(d[k].nbytes, np.uint8) for k in order]
        ready = []
        r = d.load(list(zip(order, bufs)), threads=2, inflight=1 << 20,
                   on_ready=ready.append)
        assert ready == order
        assert r["tensors"] == 4 and r["bytes"] == sum(b.nbytes for b in bufs)
        assert r["peak_inflight"] <= 1 << 20 or r["peak_inflight"] <= 2 << 20
        for k, b in zip(order, bufs):
            assert bytes(b) == bytes(d[k].numpy(raw=True))
        with pytest.raises(ValueError, match="cannot hold"):
            d.load([("emb", np.empty(10, np.uint8))])


def test_an_exception_in_progress_stops_the_load(path):
    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop("enough")

    with pytest.raises(Stop):
        kiln.torch.load(path, progress=progress)
    with kiln.open(path) as d:
        with pytest.raises(Stop):
            d.load(["emb"], arena=True, progress=progress)


def test_placement_and_refusals(path):
    sd = kiln.torch.load(path, device={"blk.*": "cpu", "*": "cpu"})
    _same_as_file(sd, path)
    with pytest.raises(ValueError, match="matches no pattern"):
        kiln.torch.load(path, device={"blk.*": "cpu"})
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA"):
            kiln.torch.load(path, device="cuda:0")
    with pytest.raises(ValueError, match="threads"):
        kiln.torch.load(path, threads=0)
    with pytest.raises(ValueError, match="tp= needs group="):
        kiln.torch.load(path, tp={"*": 0})
    with pytest.raises(kiln.FileError):
        kiln.torch.load(path + ".missing")


def test_import_kiln_does_not_import_torch():
    code = ("import sys, kiln; assert 'torch' not in sys.modules; "
            "import kiln.torch; assert callable(kiln.torch.load)")
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
