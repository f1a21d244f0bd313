# SPDX-License-Identifier: MIT
"""Model.write_digests and Model.verify_digests (docs/integrity.md): a sidecar beside each file,
every byte checked, a flipped byte named with kiln.CorruptError, a model without digests told
how to get some."""

import os
import shutil

import pytest

import kiln

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")


@pytest.fixture
def gguf(tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(os.path.join(SAMPLES, "tiny-llama.gguf"), p)
    return str(p)


def test_written_then_verified(gguf):
    with kiln.open(gguf) as m:
        w = m.write_digests(chunk=4096)
        assert w == {"files": 1, "algorithm": "xxh3-128", "source": "sidecar",
                     "chunk_bytes": 4096, "chunks": 19, "bytes": 76160,
                     "content": w["content"]}
        assert len(w["content"]) == 32
        assert os.path.getsize(gguf + ".kiln-digest") == 64 + 19 * 16
        assert m.verify_digests() == w


def test_a_flipped_byte_is_named(gguf):
    with kiln.open(gguf) as m:
        m.write_digests(chunk=4096)
    with open(gguf, "r+b") as f:
        f.seek(50000)
        b = f.read(1)
        f.seek(50000)
        f.write(bytes([b[0] ^ 0x10]))
    with kiln.open(gguf) as m:
        with pytest.raises(kiln.CorruptError) as e:
            m.verify_digests()
    assert isinstance(e.value, kiln.Error)
    assert e.value.cls == "CORRUPT" and e.value.code == 24
    assert e.value.offset == 49152 and e.value.field == "digests"
    assert "chunk 12 (bytes 49152..53248, tensor blk.0.ffn_down.weight) differs from its digest" \
        in str(e.value)


def test_no_digests_says_how_to_get_some(gguf):
    with kiln.open(gguf) as m:
        with pytest.raises(kiln.Error) as e:
            m.verify_digests()
    assert e.value.cls == "NOTFOUND"
    assert "make them once with: klnt digest" in str(e.value)


@pytest.mark.parametrize("chunk", [0, 4095, 4097, 3 << 12, 1 << 31, -4096, "4096", 1.5])
def test_chunk_is_a_power_of_two_in_range(gguf, chunk):
    with kiln.open(gguf) as m:
        with pytest.raises(ValueError, match="power of two from 4096"):
            m.write_digests(chunk=chunk)
    assert not os.path.exists(gguf + ".kiln-digest")


@pytest.mark.parametrize("source", ["mmap", "read", "uring", "auto"])
def test_open_verify_checks_every_byte_as_it_loads(gguf, source):
    with kiln.open(gguf) as m:
        w = m.write_digests(chunk=4096)
    with kiln.open(gguf, source=source, verify=True) as m:
        assert m.info["digests_verified"] is True
        assert m.info["digest_chunks"] == w["chunks"]
        assert m.info["payload_verified"] is True
    with kiln.open(gguf, source=source) as m:
        assert m.info["digests_verified"] is False and m.info["digest_chunks"] == 0
    with open(gguf, "r+b") as f:
        f.seek(50000)
        b = f.read(1)
        f.seek(50000)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(kiln.CorruptError) as e:
        kiln.open(gguf, source=source, verify=True)
    assert e.value.offset == 49152 and e.value.field == "digests"
    assert "tensor blk.0.ffn_down.weight" in str(e.value)


def test_open_verify_without_digests_says_how_to_get_some(gguf):
    with pytest.raises(kiln.Error) as e:
        kiln.open(gguf, verify=True)
    assert e.value.cls == "NOTFOUND"
    assert "make them once with: klnt digest" in str(e.value)
    with kiln.open(gguf, verify_payload=True) as m:  # the payload rules need no digests
        assert m.info["payload_verified"] is True


# The chunk that differs, its bytes and the first tensor with bytes in it (b or c here).
DIFFERS = r"chunk \d+ \(bytes \d+\.\.\d+, tensor [bc]\) differs from its digest"


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.fixture
def st_file(tmp_path):
    """A safetensors file of 3 tensors (about 40 KiB), digests in 4 KiB chunks beside it."""
    np = pytest.importorskip("numpy")
    import kiln.safetensors.numpy as stn

    p = str(tmp_path / "m.safetensors")
    stn.save_file({"a": np.arange(4096, dtype=np.float32), "b": np.ones((64, 64), np.float16),
                   "c": np.arange(1000, dtype=np.int64)}, p)
    with kiln.open(p) as m:
        m.write_digests(chunk=4096)
    return p


def test_torch_load_verify(st_file, tmp_path):
    torch = pytest.importorskip("torch")
    import kiln.torch as kt

    want = kt.load(st_file)
    got = kt.load(st_file, verify=True)
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="not with group="):
        kt.load(st_file, verify=True, group=True)
    bare = str(tmp_path / "bare.safetensors")
    shutil.copy(st_file, bare)
    with pytest.raises(kiln.Error, match="klnt digest"):
        kt.load(bare, verify=True)
    kt.load(bare)  # without verify= digests are not asked for
    _flip(st_file, os.path.getsize(st_file) - 100)  # in c, the last tensor
    with pytest.raises(kiln.CorruptError, match=DIFFERS):
        kt.load(st_file, verify=True)
    kt.load(st_file)  # unverified, the flip goes unseen: why verify= exists


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_dropin_verify(st_file, tmp_path, backend):
    torch = pytest.importorskip("torch")
    import kiln.safetensors as st
    import kiln.safetensors.numpy as stn
    import kiln.safetensors.torch as stt

    with st.safe_open(st_file, "pt", backend=backend, verify=True) as f:
        assert torch.equal(f.get_tensor("c"), torch.arange(1000))
    assert stn.load_file(st_file, backend=backend, verify=True)["a"][4095] == 4095
    assert stt.load_file(st_file, backend=backend, verify=True)["b"].sum() == 4096
    _flip(st_file, os.path.getsize(st_file) - 100)
    # kiln's own errors, not "Error while deserializing header"
    with pytest.raises(kiln.CorruptError, match=DIFFERS):
        st.safe_open(st_file, "pt", backend=backend, verify=True)
    with pytest.raises(kiln.CorruptError):
        stn.load_file(st_file, backend=backend, verify=True)
    with pytest.raises(kiln.CorruptError):
        stt.load_file(st_file, backend=backend, verify=True)
    bare = str(tmp_path / "bare.safetensors")
    shutil.copy(st_file, bare)
    with pytest.raises(kiln.Error, match="klnt digest"):
        st.safe_open(bare, "np", backend=backend, verify=True)
    # A header safetensors refuses is still safetensors' error.
    bad = str(tmp_path / "bad.safetensors")
    with open(bad, "wb") as f:
        f.write((8).to_bytes(8, "little") + b"not json")
    with pytest.raises(st.SafetensorError, match="Error while deserializing header"):
        st.safe_open(bad, "np", backend=backend, verify=True)
