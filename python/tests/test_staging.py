# SPDX-License-Identifier: MIT
"""The CUDA path's host memory, checked on the CPU with a stand-in for CUDA's runtime: pinned
staging of the exact size (an anonymous mapping registered with cudaHostRegister, unregistered
once the copies are done; pageable where registering fails), not torch's caching allocator,
which rounds to a power of two; and read-only mappings where views feed device copies
(safe_open with a device, kiln.cuda.load(register=True))."""

import os

import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
import kiln.cuda  # noqa: E402
import kiln.safetensors  # noqa: E402
import kiln.safetensors._open as st_open  # noqa: E402
import kiln.safetensors.torch  # noqa: E402
import kiln.torch as kt  # noqa: E402


class FakeCudart:
    """cudaHostRegister/cudaHostUnregister as torch.cuda.cudart() binds them: 0 is success."""

    def __init__(self, fail=False):
        self.fail = fail
        self.registered = {}
        self.calls = []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 (CUDA's name)
        self.calls.append(("register", ptr, size, flags))
        if self.fail:
            return 2  # cudaErrorMemoryAllocation
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        assert ptr in self.registered, "unregistering memory never registered"
        del self.registered[ptr]
        return 0


@pytest.mark.parametrize("n", [1, 4096, 5 * 4096 + 3, 3 << 20])
def test_staging_is_exact_and_registered_once(n):
    rt = FakeCudart()
    s = kt._Staging(n, cudart=rt)
    assert s.pinned and s.buffer.numel() == n and s.buffer.dtype == torch.uint8
    ((what, ptr, size, flags),) = rt.calls
    # The bytes asked for (CUDA pins the pages they touch): no power-of-two rounding.
    assert what == "register" and ptr == s.buffer.data_ptr() and flags == 0 and size == n
    s.buffer[-1] = 7  # the memory is there and writable
    s.release()
    s.release()  # once only
    assert rt.calls[1:] == [("unregister", ptr)] and not rt.registered


def test_staging_falls_back_to_pageable():
    rt = FakeCudart(fail=True)
    s = kt._Staging(1 << 20, cudart=rt)
    assert not s.pinned and s.buffer.numel() == 1 << 20
    s.release()
    assert [c[0] for c in rt.calls] == ["register"]  # nothing unregistered
    s = kt._Staging(4096, cudart=None)  # torch without CUDA's runtime
    assert not s.pinned and s.buffer.numel() == 4096
    s.release()


def test_load_stages_gpu_tensors_exactly(tmp_path, monkeypatch):
    """kiln.torch.load with tensors for a GPU and no kiln CUDA adapter: those tensors go through
    one registered block of their 64-aligned sizes, released after the synchronize; the CPU ones
    own memory of their own. The GPU copy is played by a clone tagged with its device."""
    want = {"a.w": torch.arange(1000, dtype=torch.float32),
            "b.w": torch.arange(77, dtype=torch.int16),
            "c.w": torch.arange(300, dtype=torch.float64).reshape(10, 30)}
    path = str(tmp_path / "m.safetensors")
    kiln.safetensors.torch.save_file(want, path)
    rt = FakeCudart()
    events = []
    real_to = torch.Tensor.to

    def fake_to(self, *args, **kw):
        dev = torch.device(args[0]) if args else None
        if dev is not None and dev.type == "cuda":
            assert kw.get("non_blocking") is True
            assert rt.registered, "copied from memory that is not registered"
            out = self.clone()
            out.fake_device = str(dev)
            events.append("copy")
            return out
        return real_to(self, *args, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(kt, "_cudart", lambda: rt)
    monkeypatch.setattr(kt, "_gpus", lambda: None)
    got = kt.load(path, device={"a.*": "cuda:0", "c.*": "cuda:1", "*": "cpu"})
    monkeypatch.undo()

    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert got["a.w"].fake_device == "cuda:0" and got["c.w"].fake_device == "cuda:1"
    assert not hasattr(got["b.w"], "fake_device")
    registers = [c for c in rt.calls if c[0] == "register"]
    assert len(registers) == 1  # one block for both GPU tensors
    assert registers[0][2] == 4032 + 2400  # 4000 rounded to 64, then 2400
    assert rt.calls[-1] == ("unregister", registers[0][1]) and not rt.registered
    assert events == ["copy", "copy", "sync"]  # released after the synchronize


def _capture_open(monkeypatch, module, attr):
    seen = {}
    real = getattr(module, attr)

    def spy(path, **options):
        seen.update(options)
        return real(path, **options)

    monkeypatch.setattr(module, attr, spy)
    return seen


def test_safe_open_on_a_device_maps_read_only(tmp_path, monkeypatch):
    path = str(tmp_path / "m.safetensors")
    kiln.safetensors.torch.save_file({"x": torch.ones(4)}, path)
    seen = _capture_open(monkeypatch, st_open, "_kiln_open")
    with kiln.safetensors.safe_open(path, framework="pt", device="cpu") as f:
        assert torch.equal(f.get_tensor("x"), torch.ones(4))
    assert seen["copy_on_write"] is True  # CPU views are handed out: writes stay private
    seen.clear()
    # This torch has no CUDA: safe_open refuses the device, after opening the file as it
    # would for a GPU.
    with pytest.raises(kiln.safetensors.SafetensorError, match="cuda:0"):
        kiln.safetensors.safe_open(path, framework="pt", device="cuda:0")
    assert seen["copy_on_write"] is False


def test_cuda_register_maps_read_only(tmp_path, monkeypatch):
    path = str(tmp_path / "m.safetensors")
    kiln.safetensors.torch.save_file({"x": torch.ones(4)}, path)

    class Stop(Exception):
        pass

    seen = {}

    def spy(p, **options):
        seen.update(options)
        raise Stop

    monkeypatch.setattr(kiln.cuda, "_handle", lambda: object())
    monkeypatch.setattr(kiln.cuda._kiln, "open", spy)
    for register, cow in ((True, False), (False, True)):
        seen.clear()
        with pytest.raises(Stop):
            kiln.cuda.load(path, 0, register=register)
        assert seen["copy_on_write"] is cow and seen["directory_only"] is (not register)
    assert os.path.exists(path)
