# SPDX-License-Identifier: MIT
"""kiln.torch.iter_load: a stream of (name, tensor) in file order, bit for bit what
kiln.torch.load gives, for KLNT, a sharded safetensors checkpoint and GGUF; read-ahead bounded
by the window; tensors valid after later next() calls and after close; skip decided before any
byte is read; errors raised where the stream meets them; a torch model filled through it."""

import gc
import os
import shutil
import threading

import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
import kiln.safetensors.torch  # noqa: E402
import kiln.torch as kt  # noqa: E402

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")
MIB = 1 << 20


def _bytes(v):
    flat = v.contiguous().reshape(-1)
    return flat if v.dtype == torch.uint8 else flat.view(torch.uint8)


def _same(got, want):
    assert [k for k, _ in got] == list(want)
    for k, v in got:
        w = want[k]
        assert v.dtype == w.dtype and v.shape == w.shape, k
        assert torch.equal(_bytes(v), _bytes(w)), k


@pytest.fixture(scope="module")
def klnt(tmp_path_factory):
    """24 tensors of 1-1.2 MiB, a bf16 one, a bool one (torch 1.13 takes no DLPack bool: the
    viewed path), an int16 and an empty one."""
    p = str(tmp_path_factory.mktemp("it") / "m.klnt")
    g = torch.Generator().manual_seed(3)
    t = {f"blk.{i}.w": torch.randn(256, 1024 + 8 * i, generator=g) for i in range(24)}
    t["emb"] = torch.randn(1031, 512, generator=g).to(torch.bfloat16)
    t["mask"] = torch.arange(0, 77) % 3 == 0
    t["odd"] = torch.arange(0, 1001, dtype=torch.int16)
    t["empty"] = torch.zeros(0, 3)
    kiln.save_file(t, p)
    return p


@pytest.mark.parametrize("source", ["klnt", "tiny-sharded/model.safetensors.index.json",
                                    "tiny-sharded/model-00002-of-00002.safetensors",
                                    "tiny-llama.gguf"])
def test_same_as_load_in_file_order(klnt, source):
    path = klnt if source == "klnt" else os.path.join(SAMPLES, source)
    want = kt.load(path)
    for window in (2 * MIB, 64 * MIB):
        with kt.iter_load(path, window_bytes=window) as it:
            got = list(it)
        _same(got, want)
        assert it.bytes_done == it.total_bytes == it.bytes_read


def test_batches_are_half_the_window_and_read_ahead_is_bounded(klnt):
    it = kt.iter_load(klnt, window_bytes=4 * MIB)
    sizes = [sum(it._plan[i].nbytes for i in b) for b in it._batches]
    biggest = max(p.nbytes for p in it._plan)
    assert len(sizes) > 8
    for b, n in zip(it._batches, sizes):
        assert n <= 2 * MIB or len(b) == 1, (b, n)
    got = 0
    for _name, _t in it:
        got += 1
        # One batch being handed out, at most one more read ahead.
        assert it._ahead <= 4 * MIB
    assert got == it.tensors
    assert 0 < it.peak_ahead <= 4 * MIB and biggest < 2 * MIB


def test_tensors_stay_valid_after_next_and_close(klnt):
    want = kt.load(klnt)
    it = kt.iter_load(klnt, window_bytes=2 * MIB)
    kept = [next(it) for _ in range(5)]  # several batches
    it.close()
    assert it._models == [] and it._pool._shutdown
    with pytest.raises(StopIteration):
        next(it)
    del it
    gc.collect()
    scratch = [torch.full((1 << 18,), 7.0) for _ in range(16)]  # reuse freed memory, if any
    for k, v in kept:
        assert torch.equal(_bytes(v), _bytes(want[k])), k
    del scratch


def test_listed_files_in_natural_order_and_duplicates_refused(tmp_path):
    paths = []
    for i in (10, 2, 1):
        p = str(tmp_path / f"w-{i}.safetensors")
        kiln.safetensors.torch.save_file({f"t{i}": torch.full((3,), float(i))}, p)
        paths.append(p)
    got = list(kt.iter_load(paths))
    assert [k for k, _ in got] == ["t1", "t2", "t10"]
    assert [float(v[0]) for _, v in got] == [1.0, 2.0, 10.0]
    dup = str(tmp_path / "w-3.safetensors")
    kiln.safetensors.torch.save_file({"t2": torch.zeros(3)}, dup)
    with pytest.raises(ValueError, match=r"tensor 't2' is in .*w-2.safetensors and in "
                                         r".*w-3.safetensors"):
        kt.iter_load(paths + [dup])


def test_skip_is_decided_before_any_byte_is_read(klnt):
    asked = []

    def skip(name):
        asked.append(name)
        return name.startswith("blk.1")  # blk.1, blk.10..blk.19

    it = kt.iter_load(klnt, skip=skip, window_bytes=4 * MIB)
    with kiln.open(klnt) as d:
        names = [t.name for t in d]
        sizes = {t.name: t.nbytes for t in d}
    assert asked == names and it.bytes_read == 0  # every decision made, nothing read yet
    got = [k for k, _ in it]
    assert got == [n for n in names if not n.startswith("blk.1")]
    assert it.bytes_read == sum(sizes[n] for n in got)  # skipped ones were never read


def test_an_exception_in_skip_or_progress_is_raised_and_frees(klnt):
    def bad(name):
        raise KeyError("no")

    with pytest.raises(KeyError):
        kt.iter_load(klnt, skip=bad)
    calls = []

    def progress(done, total):
        calls.append((done, total))
        if len(calls) == 2:
            raise RuntimeError("stop")

    it = kt.iter_load(klnt, progress=progress, window_bytes=2 * MIB)
    with pytest.raises(RuntimeError, match="stop"):
        for _ in it:
            pass
    assert it._models == [] and calls[0][1] == it.total_bytes and calls[0][0] < calls[1][0]


def test_a_read_failure_is_raised_where_the_stream_meets_it(tmp_path, klnt):
    p = str(tmp_path / "cut.klnt")
    shutil.copy(klnt, p)
    it = kt.iter_load(p, window_bytes=2 * MIB)
    first = next(it)
    os.truncate(p, os.path.getsize(p) // 2)  # after open: the later reads come up short
    with pytest.raises(kiln.Error) as e:
        for _ in it:
            pass
    assert "cut.klnt" in str(e.value) or e.value.tensor
    assert it._models == []
    with pytest.raises(StopIteration):
        next(it)
    assert first[1].numel() > 0


def test_closing_early_stops_the_read_ahead(klnt):
    before = {t.name for t in threading.enumerate()}
    it = kt.iter_load(klnt, window_bytes=2 * MIB)
    next(it)
    it.close()
    left = [t for t in threading.enumerate()
            if t.name not in before and t.name.startswith("kiln-iter-load")]
    assert left == []
    assert it.bytes_read < it.total_bytes


def test_arguments_are_checked():
    p = os.path.join(SAMPLES, "tiny-llama.gguf")
    with pytest.raises(ValueError, match="window_bytes"):
        kt.iter_load(p, window_bytes=MIB)
    with pytest.raises(ValueError, match="threads"):
        kt.iter_load(p, threads=0)
    with pytest.raises(TypeError, match="skip"):
        kt.iter_load(p, skip="blk.*")
    with pytest.raises(ValueError, match="cpu or cuda"):
        kt.iter_load(p, device="meta")
    with pytest.raises(ValueError, match="no files"):
        kt.iter_load([])
    with pytest.raises(kiln.FileError):
        kt.iter_load(p + ".absent")


def test_unnamed_klnt_tensors_are_named_by_index(tmp_path):
    import numpy as np

    p = str(tmp_path / "u.klnt")
    kiln.write_file(p, [(None, "f32", (2,), np.ones(2, np.float32)),
                        (None, "f32", (1,), np.zeros(1, np.float32))])
    assert [k for k, _ in kt.iter_load(p)] == ["0", "1"]


def test_verify_checks_digests_before_handing_out(tmp_path):
    p = str(tmp_path / "m.gguf")
    shutil.copy(os.path.join(SAMPLES, "tiny-llama.gguf"), p)
    with pytest.raises(kiln.Error, match="klnt digest"):
        kt.iter_load(p, verify=True)
    with kiln.open(p) as m:
        m.write_digests(chunk=4096)
    _same(list(kt.iter_load(p, verify=True)), kt.load(p))
    with open(p, "r+b") as f:
        f.seek(50000)
        b = f.read(1)
        f.seek(50000)
        f.write(bytes([b[0] ^ 1]))
    # Checked as each batch is read: the batches before it are handed out, no tensor of the
    # failed one is.
    got = []
    with pytest.raises(kiln.CorruptError, match="blk.0.ffn_down.weight"):
        for name, _ in kt.iter_load(p, verify=True, window_bytes=2 << 20):
            got.append(name)
    assert "blk.0.ffn_down.weight" not in got


def test_a_torch_model_filled_through_the_stream_is_bit_identical(tmp_path):
    """A state dict saved with the drop-in, streamed into a fresh model of the same shape with
    copy_ (as a runtime's weight loader does), outputs identical."""
    import kiln.safetensors.torch as st

    torch.manual_seed(0)

    def model():
        return torch.nn.Sequential(torch.nn.Embedding(97, 64), torch.nn.LayerNorm(64),
                                   torch.nn.Linear(64, 256), torch.nn.GELU(),
                                   torch.nn.Linear(256, 97))

    a = model()
    p = str(tmp_path / "model.safetensors")
    st.save_file({k: v.contiguous() for k, v in a.state_dict().items()}, p)
    b = model()  # other random weights
    params = dict(b.named_parameters())
    filled = set()
    with torch.no_grad():
        for name, t in kt.iter_load(p, window_bytes=2 * MIB):
            params[name].copy_(t)
            filled.add(name)
    assert filled == set(params)
    x = torch.randint(0, 97, (5, 11))
    assert torch.equal(a(x), b(x))
