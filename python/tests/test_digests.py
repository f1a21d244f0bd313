# SPDX-License-Identifier: MIT
"""Model.write_digests and Model.verify_digests (docs/integrity.md): a sidecar beside each file,
every byte checked, a flipped byte named with kiln.CorruptError, a model without digests told
how to get some."""

import os
import shutil

import pytest

import kiln
from conftest import flip_bit, klnt_cli, klnt_env

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
    bare = str(tmp_path / "bare.safetensors")
    shutil.copy(st_file, bare)
    with pytest.raises(kiln.Error, match="klnt digest"):
        kt.load(bare, verify=True)
    kt.load(bare)  # without verify= digests are not asked for
    flip_bit(st_file, os.path.getsize(st_file) - 100)  # in c, the last tensor
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
    flip_bit(st_file, os.path.getsize(st_file) - 100)
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


# --- digest tables the writers put in the files (docs/integrity.md, "In the files") ----------

def _st_header(path):
    """A safetensors header as the format defines it: 8-byte little-endian length, JSON."""
    import json
    import struct

    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n].decode("utf-8")), raw, 8 + n


def test_kiln_save_file_writes_its_table(tmp_path):
    np = pytest.importorskip("numpy")
    p = str(tmp_path / "m.klnt")
    ts = {"w": np.arange(300000, dtype=np.float32), "b": np.ones(7, np.int8)}
    kiln.save_file(ts, p, metadata={"format": "pt"})
    with kiln.open(p) as m:
        assert list(m.keys()) == ["w", "b", kiln.METADATA_TENSOR]  # not the table
        assert [m[i].role for i in range(len(m))] == ["model", "model", "metadata"]
        r = m.verify_digests()
        assert r["source"] == "embedded" and r["algorithm"] == "xxh3-128"
        assert r["chunk_bytes"] == 1 << 20 and r["chunks"] == 2
    with kiln.open(p, verify=True) as m:
        assert m.info["digests_verified"] is True
    # the loads hand out the weights alone
    assert set(kiln.load_file(p)) == {"w", "b"}
    torch = pytest.importorskip("torch")
    import kiln.torch as kt

    got = kt.load(p, verify=True)
    assert set(got) == {"w", "b"} and torch.equal(got["w"], torch.arange(300000.0))
    assert [n for n, _ in kt.iter_load(p, verify=True)] == ["w", "b"]
    flip_bit(p, 4096 + 1000)  # in w
    with pytest.raises(kiln.CorruptError, match=r"chunk 0 \(bytes 0\.\.1048576, tensor w\)"):
        kt.load(p, verify=True)
    # digests=False: the tensors alone; nothing to check against, and says how to get some
    kiln.save_file(ts, p, digests=False)
    with kiln.open(p) as m:
        with pytest.raises(kiln.Error, match="klnt digest"):
            m.verify_digests()


def test_dropin_save_file_keeps_safetensors_bytes_unless_asked(tmp_path):
    np = pytest.importorskip("numpy")
    import kiln.safetensors.numpy as stn

    ts = {"a": np.arange(50000, dtype=np.float32), "b": np.ones((3, 5), np.float16)}
    plain, withd = str(tmp_path / "p.safetensors"), str(tmp_path / "d.safetensors")
    stn.save_file(ts, plain, metadata={"format": "np"})
    assert open(plain, "rb").read() == stn.save(ts, metadata={"format": "np"})
    h, _, _ = _st_header(plain)
    assert h["__metadata__"] == {"format": "np"}
    with kiln.open(plain) as m, pytest.raises(kiln.Error, match="klnt digest"):
        m.verify_digests()
    stn.save_file(ts, withd, metadata={"format": "np"}, digests=True)
    # An independent reading of the file: the metadata gains one string entry, the tensors are
    # the same bytes at the same offsets of the data region.
    h2, raw2, base2 = _st_header(withd)
    hp, rawp, basep = _st_header(plain)
    table = h2["__metadata__"].pop("kiln.digests")
    assert isinstance(table, str) and h2 == hp and raw2[base2:] == rawp[basep:]
    import kiln.safetensors as st

    with st.safe_open(withd, "np") as f:
        assert f.metadata() == {"format": "np"}  # the table is the file's, not metadata
        assert sorted(f.keys()) == ["a", "b"]
    with st.safe_open(withd, "np", verify=True) as f:
        assert f.get_tensor("a")[49999] == 49999
    flip_bit(withd, base2 + 1000)
    with pytest.raises(kiln.CorruptError, match="tensor a"):
        stn.load_file(withd, verify=True)
    with pytest.raises(TypeError, match="digests must be a bool"):
        stn.save_file(ts, withd, digests="yes")


def _gguf_read(path):
    """A GGUF file as the format defines it (v3, little-endian): its key/values and tensor
    infos, read by this small reader of its own, and the data section's start."""
    import struct

    raw = open(path, "rb").read()
    assert raw[:4] == b"GGUF"
    version, nt, nkv = struct.unpack_from("<IQQ", raw, 4)
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        s = raw[pos + 8:pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            it, n = struct.unpack_from("<IQ", raw, pos)
            pos += 12
            if it in sizes:
                v = raw[pos:pos + n * sizes[it]]
                pos += n * sizes[it]
                return (it, v)
            return (it, [value(it) for _ in range(n)])
        v = raw[pos:pos + sizes[t]]
        pos += sizes[t]
        return v

    kv = {}
    for _ in range(nkv):
        k = string()
        (t,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        kv[k] = (t, value(t))
    infos = []
    for _ in range(nt):
        name = string()
        (nd,) = struct.unpack_from("<I", raw, pos)
        dims = struct.unpack_from(f"<{nd}Q", raw, pos + 4)
        typ, off = struct.unpack_from("<IQ", raw, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, dims, typ, off))
    align = 32
    if "general.alignment" in kv:
        align = struct.unpack("<I", kv["general.alignment"][1])[0]
    data = -(-pos // align) * align
    return version, kv, infos, data, raw


def test_gguf_export_is_read_by_an_independent_reader(tmp_path):
    import subprocess

    klnt = klnt_cli()
    env = klnt_env()
    src = os.path.join(SAMPLES, "tiny-llama.gguf")
    k, out, bare = (str(tmp_path / n) for n in ("m.klnt", "m.gguf", "bare.gguf"))
    for args in (["import", "-o", k, src], ["export", "--to", "gguf", "-o", out, k],
                 ["export", "--no-digests", "--to", "gguf", "-o", bare, k]):
        r = subprocess.run([klnt, *args], capture_output=True, env=env)
        assert r.returncode == 0, r.stderr
    assert open(bare, "rb").read() == open(src, "rb").read()
    v0, kv0, infos0, data0, raw0 = _gguf_read(src)
    v1, kv1, infos1, data1, raw1 = _gguf_read(out)
    t, (it, table) = kv1.pop("kiln.digests")
    assert (t, it) == (9, 0) and kv1 == kv0  # an array of u8; the rest as it was
    assert table[:8] == b"KILNDGST"
    assert v1 == v0 and infos1 == infos0
    for name, dims, typ, off in infos0:  # the same payload bytes, each at its offset
        assert raw1[data1 + off:data1 + off + 64] == raw0[data0 + off:data0 + off + 64], name
    with kiln.open(out) as m:
        assert m.verify_digests()["source"] == "embedded"
        assert "kiln.digests" not in m.metadata()
