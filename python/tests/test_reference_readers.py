# SPDX-License-Identifier: MIT
"""Files kiln writes, read by the formats' own reference readers: llama.cpp's gguf-py
(``pip install gguf``) and Hugging Face's safetensors (``pip install safetensors``).

Neither is packaged in Debian 12, and CI reaches Debian's archive only, so there these tests are
skipped, saying why; wherever either reader is installed they run with the rest of the suite.
What the reference reader sees is compared with what kiln sees: every tensor's name, shape, type,
offset and bytes, every key/value with its type. kiln's digest table is one more key/value
(GGUF: an array of u8) or ``__metadata__`` string (safetensors) to them, and it verifies; a
flipped payload byte is caught, naming its chunk."""

import json
import os
import subprocess

import numpy as np
import pytest

import kiln
import kiln.safetensors.numpy as kiln_st
from conftest import flip_bit, klnt_cli, klnt_env

# kiln's plain dtypes and their ggml type ids (docs/convert.md); an opaque dtype is 4096 + id.
GGML_OF = {"f32": 0, "f16": 1, "i8": 24, "i16": 25, "i32": 26, "i64": 27, "f64": 28, "bf16": 30}
# GGUF's value types by id, as kiln names them (kiln.Model.metadata(types=True)).
GGUF_TYPE = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
             8: "str", 9: "arr", 10: "u64", 11: "i64", 12: "f64"}


def _rbytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def _many_types(path):
    """A KLNT file of every plain dtype GGUF has (ranks 0 to 4, odd sizes, a Unicode name) and
    several ggml block types, for klnt export --to gguf."""
    rng = np.random.default_rng(7)
    plain = [
        ("t.f32", "f32", (3, 5, 7), rng.standard_normal((3, 5, 7)).astype(np.float32)),
        ("t.f16", "f16", (17, 9), rng.standard_normal((17, 9)).astype(np.float16)),
        ("t.bf16", "bf16", (4, 33), _rbytes(rng, 4 * 33 * 2)),
        ("t.f64", "f64", (2, 3, 4, 5), rng.standard_normal((2, 3, 4, 5))),
        ("t.i8", "i8", (101,), rng.integers(-128, 128, 101, dtype=np.int8)),
        ("t.i16", "i16", (7, 3), rng.integers(-30000, 30000, (7, 3), dtype=np.int16)),
        ("t.i32", "i32", (5, 5), rng.integers(-2**31, 2**31, (5, 5), dtype=np.int32)),
        ("t.i64", "i64", (3,), rng.integers(-2**62, 2**62, 3, dtype=np.int64)),
        ("t.scalar", "f32", (), np.array(3.25, dtype=np.float32)),
        ("t.unicode.é漢字", "f32", (2,), np.array([1, 2], dtype=np.float32)),
    ]
    specs = [(n, d, s, np.ascontiguousarray(a).reshape(-1).view(np.uint8))
             for n, d, s, a in plain]
    # name, ggml id, elements and bytes a block, shape (outermost first)
    for name, gid, epb, bpb, shape in [("q.Q8_0", 8, 32, 34, (4, 64)),
                                       ("q.Q4_0", 2, 32, 18, (2, 32)),
                                       ("q.Q4_K", 12, 256, 144, (3, 256)),
                                       ("q.Q6_K", 14, 256, 210, (1, 2, 512)),
                                       ("q.IQ4_NL", 20, 32, 18, (5, 32)),
                                       ("q.MXFP4", 39, 32, 17, (2, 64)),
                                       ("q.TQ2_0", 35, 256, 66, (256,))]:
        n = int(np.prod(shape)) // epb * bpb
        layout = name.split(".", 1)[1]
        specs.append((name, 4096 + gid, shape, _rbytes(rng, n),
                      {"layout": layout, "block_size": bpb}))
    kiln.write_file(path, specs, sync=False)


def _typed_keys(path):
    """A KLNT file whose metadata document is a GGUF one: a key/value of every value type,
    extremes, a NaN, UTF-8, empty strings and arrays."""
    kv = [
        {"key": "general.architecture", "type": "str", "value": "llama"},
        {"key": "general.alignment", "type": "u32", "value": 64},
        {"key": "x.u8", "type": "u8", "value": 255},
        {"key": "x.i8", "type": "i8", "value": -128},
        {"key": "x.u16", "type": "u16", "value": 65535},
        {"key": "x.i16", "type": "i16", "value": -32768},
        {"key": "x.u32", "type": "u32", "value": 4294967295},
        {"key": "x.i32", "type": "i32", "value": -2147483648},
        {"key": "x.u64", "type": "u64", "value": 18446744073709551615},
        {"key": "x.i64", "type": "i64", "value": -9223372036854775808},
        {"key": "x.f32", "type": "f32", "value": 0.1},
        {"key": "x.f64", "type": "f64", "value": 1e-300},
        {"key": "x.f32nan", "type": "f32", "value": "bits:0x7fc00000"},
        {"key": "x.bool", "type": "bool", "value": True},
        {"key": "x.str", "type": "str", "value": "héllo 漢字"},
        {"key": "x.str.empty", "type": "str", "value": ""},
        {"key": "x.arr.str", "type": "arr", "value": {"type": "str", "items": ["a", "", "ü"]}},
        {"key": "x.arr.i32", "type": "arr", "value": {"type": "i32", "items": [1, -2, 3]}},
        {"key": "x.arr.empty", "type": "arr", "value": {"type": "u8", "items": []}},
        {"key": "x.arr.bool", "type": "arr", "value": {"type": "bool", "items": [True, False]}},
    ]
    doc = {"kiln.metadata": 1, "source": "gguf", "gguf": {"version": 3, "alignment": 64,
                                                         "kv": kv}}
    rng = np.random.default_rng(3)
    specs = [("a", "f32", (3, 3), rng.standard_normal(9).astype(np.float32).view(np.uint8)),
             ("b", "f16", (5,), rng.standard_normal(5).astype(np.float16).view(np.uint8)),
             ("c", 4096 + 8, (1, 32), _rbytes(rng, 34), {"layout": "Q8_0", "block_size": 34})]
    kiln.write_file(path, specs, sync=False, metadata=json.dumps(doc).encode())


def _caught(path, at):
    """A bit flipped at `at` fails a checked open naming the chunk; put back, it passes."""
    flip_bit(path, at)
    with pytest.raises(kiln.CorruptError) as e:
        kiln.open(path, verify=True)
    assert e.value.field == "digests" and "chunk " in str(e.value)
    flip_bit(path, at)
    with kiln.open(path, verify=True) as m:
        assert m.info["digests_verified"] is True


def _gguf_py():
    return pytest.importorskip(
        "gguf", reason="llama.cpp's gguf-py is not installed (pip install gguf); "
        "Debian 12 does not package it")


@pytest.fixture(scope="module", params=["many_types", "typed_keys"])
def kiln_gguf(request, tmp_path_factory):
    """A GGUF file klnt export wrote from a KLNT file kiln wrote (made only where gguf-py is)."""
    _gguf_py()
    d = tmp_path_factory.mktemp("gguf")
    src, out = str(d / "m.klnt"), str(d / "m.gguf")
    (_many_types if request.param == "many_types" else _typed_keys)(src)
    r = subprocess.run([klnt_cli(), "export", "--to", "gguf", "-o", out, src],
                       capture_output=True, env=klnt_env())
    assert r.returncode == 0, r.stderr
    return out


def test_gguf_py_sees_what_kiln_sees(kiln_gguf):
    gguf = _gguf_py()
    r = gguf.GGUFReader(kiln_gguf)
    with kiln.open(kiln_gguf) as m:
        # Key/values: kiln leaves its own digest table out of the model's metadata.
        meta = m.metadata(types=True)
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert list(meta) == [k for k in keys if k != "kiln.digests"]
        for k, (ktype, kval) in meta.items():
            f = r.fields[k]
            if f.types[0] == gguf.GGUFValueType.ARRAY:
                gtype = "arr:" + GGUF_TYPE[int(f.parts[3][0])]  # the item type as written
            else:
                gtype = GGUF_TYPE[int(f.types[0])]
            assert gtype == ktype, k
            gval = f.contents()
            if isinstance(kval, float) and np.isnan(kval):
                assert np.isnan(gval), k
            elif isinstance(kval, float):
                assert np.float64(kval) == np.float64(gval), k
            else:
                assert kval == gval, k
        dig = r.fields["kiln.digests"]
        assert [int(t) for t in dig.types] == [int(gguf.GGUFValueType.ARRAY),
                                              int(gguf.GGUFValueType.UINT8)]
        # Tensors: names, shapes (ggml's ne is innermost first), types, offsets, bytes.
        assert len(r.tensors) == len(m)
        for gt, kt in zip(r.tensors, m):
            assert gt.name == kt.name
            shape, gshape = tuple(reversed(tuple(kt.shape))), tuple(int(x) for x in gt.shape)
            assert gshape == shape or (shape == () and gshape == (1,)), kt.name
            want = GGML_OF.get(kt.dtype, kt.dtype_code - 4096)
            assert int(gt.tensor_type) == want, kt.name
            assert gt.n_bytes == kt.nbytes and gt.data_offset == kt.file_offset, kt.name
            assert gt.data_offset % r.alignment == 0
            assert gt.data.tobytes() == kt.numpy(raw=True).tobytes(), kt.name
        last = list(m)[-1]
        at = last.file_offset + last.nbytes - 1
    with kiln.open(kiln_gguf, verify=True) as m:
        assert m.info["digests_verified"] is True
    _caught(kiln_gguf, at)


def test_safetensors_sees_what_kiln_sees(tmp_path):
    st = pytest.importorskip(
        "safetensors", reason="Hugging Face's safetensors is not installed "
        "(pip install safetensors); Debian 12 does not package it")
    import safetensors.numpy

    rng = np.random.default_rng(5)
    tensors = {
        "w.f32": rng.standard_normal((6, 10)).astype(np.float32),
        "w.f16": rng.standard_normal((10, 6)).astype(np.float16),
        "w.i8": rng.integers(-128, 128, (8, 8), dtype=np.int8),
        "w.u8": _rbytes(rng, 16),
        "w.i64": rng.integers(-2**62, 2**62, (3,), dtype=np.int64),
        "w.bool": rng.integers(0, 2, (5,)).astype(np.bool_),
        "w.scalar": np.array(2.5, dtype=np.float64),
        "w.empty": np.zeros((0, 4), dtype=np.float32),
        "w.ünïcode": np.arange(4, dtype=np.int32),
    }
    user = {"format": "np", "note": "ünïcode ✓"}
    # The drop-in writes safetensors' own bytes by default; digests=True adds kiln's table.
    for digests in (False, True):
        p = str(tmp_path / f"m{int(digests)}.safetensors")
        kiln_st.save_file(tensors, p, metadata=user, digests=digests)
        got = safetensors.numpy.load_file(p)
        assert sorted(got) == sorted(tensors)
        for name, a in tensors.items():
            assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
            assert got[name].tobytes() == a.tobytes(), name
        with st.safe_open(p, framework="np") as f:
            meta = f.metadata()
        # The user's strings as given; kiln's digest table, when written, one string more.
        assert meta == dict(user, **({"kiln.digests": meta.get("kiln.digests")}
                                     if digests else {}))
        assert isinstance(meta.get("kiln.digests", ""), str)
        with kiln.open(p) as m:
            assert m.metadata() == user
            t = m["w.i64"]
            at = t.file_offset + t.nbytes // 2
    with kiln.open(p, verify=True) as m:
        assert m.info["digests_verified"] is True
    _caught(p, at)
