# SPDX-License-Identifier: MIT
"""PyTorch through DLPack: bfloat16, zero copy, safe_open(framework="pt"), save_file of tensors."""

import gc

import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "pt.klnt")
    kiln.save_file({"f": torch.arange(24, dtype=torch.float32).reshape(4, 6),
                    "bf": torch.tensor([[1.5, -2.0, 3.25], [0.0, 1e10, -1e-3]],
                                       dtype=torch.bfloat16),
                    "i": torch.arange(-3, 3, dtype=torch.int64),
                    "h": torch.ones(3, dtype=torch.float16),
                    "b": torch.tensor([True, False, True])}, p)
    return p


def test_from_dlpack_f32_zero_copy(path):
    with kiln.open(path) as d:
        t = d["f"]
        x = torch.from_dlpack(t)
        assert x.dtype == torch.float32 and tuple(x.shape) == (4, 6)
        assert x.data_ptr() == t.address and x.data_ptr() % 64 == 0
        assert torch.equal(x, torch.arange(24, dtype=torch.float32).reshape(4, 6))
        assert x.data_ptr() == torch.from_dlpack(d["f"]).data_ptr()
    gc.collect()
    assert float(x.sum()) == 276.0  # outlives the with block


def test_bfloat16(path):
    with kiln.open(path) as d:
        t = d["bf"]
        assert t.dtype == "bf16"
        x = torch.from_dlpack(t)
        assert x.dtype == torch.bfloat16 and x.data_ptr() == t.address
        want = torch.tensor([[1.5, -2.0, 3.25], [0.0, 1e10, -1e-3]], dtype=torch.bfloat16)
        assert torch.equal(x, want)
        with pytest.raises(TypeError, match="bf16"):
            t.numpy()


def test_safe_open_pt(path):
    with kiln.safe_open(path, framework="pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        sl = f.get_slice("bf")[:, ::-2]
        fs = f.get_slice("f")[1:3, ::2]
    assert got["bf"].dtype == torch.bfloat16 and got["b"].dtype == torch.bool
    assert got["b"].tolist() == [True, False, True]
    assert got["i"].tolist() == [-3, -2, -1, 0, 1, 2]
    assert got["h"].dtype == torch.float16
    want = torch.from_numpy(got["bf"].float().numpy()[:, ::-2].copy()).bfloat16()
    assert sl.dtype == torch.bfloat16 and torch.equal(sl, want)
    assert torch.equal(fs, torch.arange(24, dtype=torch.float32).reshape(4, 6)[1:3, ::2])
    loaded = kiln.load_file(path, framework="pt")
    assert torch.equal(loaded["f"], got["f"])


def test_raw_capsule(path):
    with kiln.open(path) as d:
        raw = torch.from_dlpack(d["bf"].to_dlpack(raw=True))
        assert raw.dtype == torch.uint8 and raw.numel() == 12
        assert torch.equal(raw.view(torch.bfloat16).reshape(2, 3), torch.from_dlpack(d["bf"]))


@pytest.fixture
def f8path(tmp_path):
    p = str(tmp_path / "f8.klnt")
    kiln.write_file(p, [("e4", "f8e4m3", (2, 2), bytes([0x38, 0xC0, 0x00, 0x40])),
                        ("e5", "f8e5m2", (2,), bytes([0x3C, 0xC0])),
                        ("m0", "e8m0", (), bytes([0x7F])),
                        ("q", "e2m1", (4,), bytes([0x21, 0x43]))])
    return p


def test_float8(f8path):
    """float8 types where this torch has them; a TypeError naming the dtype where it has not."""
    with kiln.safe_open(f8path, framework="pt") as f:
        if not hasattr(torch, "float8_e4m3fn"):
            with pytest.raises(TypeError, match=r"f8e4m3.*PyTorch.*raw=True"):
                f.get_tensor("e4")
            with pytest.raises(TypeError, match="f8e5m2"):
                f.get_slice("e5")[:1]
        else:
            e4 = f.get_tensor("e4")
            assert e4.dtype == torch.float8_e4m3fn and tuple(e4.shape) == (2, 2)
            assert e4.float().tolist() == [[1.0, -2.0], [0.0, 2.0]]
            assert f.get_slice("e4")[:, ::-1].float().tolist() == [[-2.0, 1.0], [2.0, 0.0]]
            assert f.get_tensor("e5").float().tolist() == [1.0, -2.0]
        with pytest.raises(TypeError, match="e2m1"):
            f.get_tensor("q")
    with kiln.open(f8path) as d:
        assert torch.from_dlpack(d["q"].to_dlpack(raw=True)).tolist() == [0x21, 0x43]


def _file_bytes(p):
    with open(p, "rb") as fh:
        return fh.read()


@pytest.mark.parametrize("how", ["safe_open", "load_file", "from_dlpack", "bf16", "bool"])
def test_writes_are_private_copies(path, how):
    """torch has no read-only tensors: a write lands in a private copy of the page (the file is
    mapped copy-on-write), never in the file or another open of it, and never faults."""
    before = _file_bytes(path)
    if how == "safe_open":
        with kiln.safe_open(path, framework="pt") as f:
            x = f.get_tensor("f")
    elif how == "load_file":
        x = kiln.load_file(path, framework="pt")["f"]
    elif how == "from_dlpack":
        with kiln.open(path) as d:
            x = torch.from_dlpack(d["f"])
    elif how == "bf16":
        with kiln.safe_open(path, framework="pt") as f:
            x = f.get_tensor("bf")
    else:
        with kiln.safe_open(path, framework="pt") as f:
            x = f.get_tensor("b")
    gc.collect()
    if x.dtype == torch.bool:
        x.fill_(False)
        assert not x.any()
    else:
        x.fill_(7)
        x[0] = -1
        assert float(x[0].flatten()[0]) == -1.0 and float(x.flatten()[-1]) == 7.0
    assert _file_bytes(path) == before, "the file is unchanged"
    with kiln.safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_tensor("f"), torch.arange(24, dtype=torch.float32).reshape(4, 6))
        assert f.get_tensor("b").tolist() == [True, False, True]
    with kiln.safe_open(path, framework="np") as f:
        assert f.get_tensor("f").ravel().tolist() == list(range(24))


def test_writes_are_seen_within_one_open(path):
    """Tensors of one open share the mapping (as safetensors' do): a write is seen by them all,
    and numpy arrays stay read-only."""
    with kiln.safe_open(path, framework="pt") as f:
        a, b = f.get_tensor("f"), f.get_tensor("f")
        a[0, 0] = 99.0
        assert float(b[0, 0]) == 99.0
    with kiln.safe_open(path, framework="np") as f:
        assert not f.get_tensor("f").flags.writeable


def test_read_only_mapping_is_still_available(path):
    """copy_on_write=False maps read-only shared: what makes the default necessary (a write
    through torch is then SIGSEGV), shown in a child process."""
    import os
    import signal
    import subprocess
    import sys

    code = ("import sys, torch, kiln\n"
            "d = kiln.open(sys.argv[1], copy_on_write=False)\n"
            "x = torch.from_dlpack(d['f'])\n"
            "x[0, 0] = 1.0\n"
            "print('wrote')\n")
    # Under the ASan build the preloaded runtime would turn the signal into its own report.
    asan = os.environ.get("ASAN_OPTIONS", "")
    env = dict(os.environ, PYTHONFAULTHANDLER="", ASAN_OPTIONS=f"{asan}:handle_segv=0".lstrip(":"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(kiln.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, env=env)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", code.replace("False", "True"), path],
                       capture_output=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == b"wrote", r.stderr
