# SPDX-License-Identifier: MIT
"""save_file -> safe_open / load_file / kiln.open round trips for every numpy-native dtype."""

import os

import numpy as np
import pytest

import kiln
from conftest import klnt_cli, klnt_env

DTYPES = {
    "bool": np.bool_, "u8": np.uint8, "i8": np.int8, "u16": np.uint16, "i16": np.int16,
    "u32": np.uint32, "i32": np.int32, "u64": np.uint64, "i64": np.int64,
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
}
SHAPES = [(), (0,), (7,), (3, 5), (2, 0, 3), (2, 3, 4), (1, 1, 1, 1, 1, 1, 1, 2)]


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_dtype_every_shape(tmp_path, name):
    tensors = {f"t{i}": sample(DTYPES[name], s, i) for i, s in enumerate(SHAPES)}
    path = str(tmp_path / "rt.klnt")
    kiln.save_file(tensors, path)
    with kiln.safe_open(path, framework="np") as f:
        assert f.keys() == sorted(tensors)
        assert f.metadata() == {}
        for k, v in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape
            np.testing.assert_array_equal(got, v)
    with kiln.open(path) as d:
        for t in d:
            assert t.dtype == name and t.shape == tensors[t.name].shape
            assert t.nbytes == tensors[t.name].nbytes


@pytest.mark.parametrize("source", ["mmap", "read", "uring"])
def test_sources_agree(tmp_path, source):
    tensors = {"a": sample(np.float32, (64, 33)), "b": sample(np.int64, (5,)),
               "c": sample(np.uint8, (1000,))}
    path = str(tmp_path / "s.klnt")
    kiln.save_file(tensors, path)
    with kiln.open(path, source=source, populate=(source == "mmap")) as d:
        assert d.info["source"] == source
        d.verify_payload()
        for k, v in tensors.items():
            np.testing.assert_array_equal(d[k].numpy(), v)


def test_load_file(tmp_path):
    tensors = {"x": sample(np.float64, (4, 4)), "y": sample(np.int16, (9,))}
    path = str(tmp_path / "l.klnt")
    kiln.save_file(tensors, path)
    got = kiln.load_file(path)
    assert sorted(got) == ["x", "y"]
    for k in tensors:
        np.testing.assert_array_equal(got[k], tensors[k])


def test_non_contiguous_and_big_endian_inputs(tmp_path):
    base = sample(np.int32, (6, 8))
    tensors = {"strided": base[::2, ::-3], "fortran": np.asfortranarray(base),
               "be": base.astype(">i4")}
    path = str(tmp_path / "nc.klnt")
    kiln.save_file(tensors, path)
    with kiln.safe_open(path, "np") as f:
        np.testing.assert_array_equal(f.get_tensor("strided"), base[::2, ::-3])
        np.testing.assert_array_equal(f.get_tensor("fortran"), base)
        np.testing.assert_array_equal(f.get_tensor("be"), base)
        assert f.get_tensor("be").dtype == np.dtype("<i4")


def test_save_replaces_file(tmp_path):
    path = str(tmp_path / "r.klnt")
    kiln.save_file({"a": np.zeros(3)}, path)
    kiln.save_file({"b": np.ones(2)}, path)
    assert kiln.load_file(path).keys() == {"b"}


def test_save_rejects(tmp_path):
    path = str(tmp_path / "bad.klnt")
    with pytest.raises(TypeError, match="complex"):
        kiln.save_file({"c": np.zeros(2, np.complex64)}, path)
    with pytest.raises(TypeError):
        kiln.save_file({1: np.zeros(2)}, path)
    with pytest.raises(ValueError):
        kiln.safe_open(path, framework="jax")


def test_write_file_checks_lengths(tmp_path):
    # 3 bytes cannot be an f32 [1]: the writer refuses with the reader's class.
    with pytest.raises(kiln.FormatError) as e:
        kiln.write_file(str(tmp_path / "w.klnt"), [("x", "f32", (1,), b"abc")])
    assert e.value.tensor == 0 and e.value.field is not None


def test_write_file_unnamed_and_dtypes_by_name(tmp_path):
    path = str(tmp_path / "u.klnt")
    kiln.write_file(path, [(None, "bf16", (2,), b"\x80\x3f\x00\x40"), (None, "u4", (3,), b"\x21\x03")],
                    sync=False)
    with kiln.open(path) as d:
        assert [t.name for t in d] == [None, None]
        assert [t.dtype for t in d] == ["bf16", "u4"]
        assert d[1].numpy(raw=True).tolist() == [0x21, 0x03]
        with pytest.raises(TypeError, match="bf16.*raw=True.*torch"):
            d[0].numpy()


def test_metadata_read_from_the_converters_tensor(tmp_path):
    """metadata() reads safetensors' __metadata__ from the kiln.metadata document (model.h)."""
    import json

    p = str(tmp_path / "m.klnt")
    doc = {"kiln.metadata": 1, "source": "safetensors",
           "safetensors": {"metadata": {"format": "pt", "n": "1"}}}
    raw = json.dumps(doc).encode()
    kiln.write_file(p, [("w", "f32", (1,), np.float32(1).tobytes()),
                        (kiln.METADATA_TENSOR, "u8", (len(raw),), raw)])
    with kiln.safe_open(p, "np") as f:
        assert f.metadata() == {"format": "pt", "n": "1"}
        assert f.keys() == ["w"]
    # A document that is not the convention is an error naming it, never a silent {}.
    for bad in (b"{not json", b"[1, 2]", b'{"safetensors": 3}', b"\xff"):
        kiln.write_file(p, [(kiln.METADATA_TENSOR, "u8", (len(bad),), bad)])
        with kiln.safe_open(p, "np") as f:
            assert f.keys() == []
            with pytest.raises(kiln.FormatTypeError) as e:
                f.metadata()
            assert "kiln.metadata" in str(e.value)


def test_save_file_metadata_round_trip(tmp_path):
    """save_file(metadata=) keeps the dict under the converters' convention; metadata() reads it."""
    import json

    p = str(tmp_path / "meta.klnt")
    meta = {"format": "pt", "ünïcode": "värde ✓", "empty": "", "quote\"s": "{\"json\": 1}"}
    kiln.save_file({"w": np.arange(3, dtype=np.float32)}, p, metadata=meta)
    with kiln.safe_open(p, "np") as f:
        assert f.metadata() == meta
        assert f.keys() == ["w"]
    with kiln.open(p) as d:
        t = d[len(d) - 1]  # the document is the last tensor (docs/convert.md)
        assert t.name == kiln.METADATA_TENSOR and t.dtype == "u8" and t.rank == 1
        doc = json.loads(t.numpy().tobytes().decode("utf-8"))
    assert doc == {"kiln.metadata": 1, "source": "klnt", "safetensors": {"metadata": meta}}
    # None writes no document; {} writes an empty one.
    kiln.save_file({"w": np.zeros(1)}, p, metadata=None)
    with kiln.open(p) as d:
        assert kiln.METADATA_TENSOR not in d
    kiln.save_file({"w": np.zeros(1)}, p, metadata={})
    with kiln.safe_open(p, "np") as f:
        assert f.metadata() == {} and f.keys() == ["w"]


@pytest.mark.parametrize("bad", [{"n": 1}, {1: "x"}, {"a": None}, [("a", "b")], "a=b"])
def test_save_file_metadata_must_be_str_to_str(tmp_path, bad):
    p = tmp_path / "bad.klnt"
    with pytest.raises(TypeError, match="metadata"):
        kiln.save_file({"a": np.zeros(2)}, str(p), metadata=bad)
    assert not p.exists()


def test_save_file_reserves_the_metadata_name(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        kiln.save_file({kiln.METADATA_TENSOR: np.zeros(2, np.uint8)}, str(tmp_path / "r.klnt"))


def test_save_file_metadata_through_klnt_export(tmp_path):
    """klnt export --to safetensors of a save_file output restores __metadata__ exactly."""
    import json
    import struct
    import subprocess

    klnt = klnt_cli()
    p, out = str(tmp_path / "m.klnt"), str(tmp_path / "m.safetensors")
    meta = {"format": "pt", "note": "ünïcode ✓", "k": ""}
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    kiln.save_file({"w": w}, p, metadata=meta)
    env = klnt_env()
    r = subprocess.run([klnt, "export", "--to", "safetensors", "-o", out, p],
                       capture_output=True, env=env)
    assert r.returncode == 0, r.stderr
    raw = open(out, "rb").read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    # The export's own digest table sits beside the metadata (klnt export --no-digests: none).
    table = header["__metadata__"].pop("kiln.digests")
    assert isinstance(table, str) and table.startswith("S0lMTkRHU1Q")  # base64 of KILNDGST
    assert header["__metadata__"] == meta
    assert header["w"]["dtype"] == "F32" and header["w"]["shape"] == [2, 3]
    start, end = header["w"]["data_offsets"]
    data = raw[8 + hlen + start:8 + hlen + end]
    np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(2, 3), w)
