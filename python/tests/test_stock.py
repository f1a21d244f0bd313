# SPDX-License-Identifier: MIT
"""Stock checkpoints opened directly: safetensors (one file, a shard, the index) and GGUF, through
kiln.open, safe_open and load_file, against what an independent reader sees in files other
tools wrote (tests/samples/*.expected.json) and against files written here byte by byte."""

import hashlib
import json
import math
import pathlib
import struct

import numpy as np
import pytest

import kiln

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "samples"
GGUF = SAMPLES / "tiny-llama.gguf"
SHARDED = SAMPLES / "tiny-sharded"
INDEX = SHARDED / "model.safetensors.index.json"
SOURCES = ["mmap", "read", "uring"]


def expected(name):
    return json.loads((SAMPLES / f"{name}.expected.json").read_text())


def sha(t):
    return hashlib.sha256(t.numpy(raw=True).tobytes()).hexdigest()


# --- GGUF ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", SOURCES)
def test_gguf_tensors_are_the_reference_readers(source):
    exp = expected("tiny-llama")
    with kiln.open(str(GGUF), source=source) as d:
        assert d.format == "gguf"
        # exactly the file's tensors, in its order: no synthetic kiln.metadata
        assert list(d.keys()) == exp["order"]
        for name, (kind, shape, digest) in exp["tensors"].items():
            t = d[name]
            gtype = kind.split(":", 1)[1]
            assert t.shape == tuple(shape), name  # outermost first
            plain = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
            if gtype in plain:
                assert t.dtype == plain[gtype] and t.layout is None
            else:
                assert t.dtype == "opaque" and t.layout == gtype
            assert sha(t) == digest, name


def test_gguf_metadata_is_typed():
    exp = expected("tiny-llama")["metadata"]
    with kiln.open(str(GGUF)) as d:
        typed = d.metadata(types=True)
        plain = d.metadata()
    assert list(typed) == list(exp)
    for key, (gtype, value) in exp.items():
        got_type, got = typed[key]
        assert got_type == gtype, key
        assert plain[key] == got
        if gtype in ("f32", "f64"):
            assert math.isclose(got, value, rel_tol=1e-7), key
        elif gtype in ("arr:f32", "arr:f64"):
            assert np.allclose(got, value, rtol=1e-7), key
        else:
            assert got == value, key
    assert isinstance(plain["tokenizer.ggml.add_bos_token"], bool)
    assert isinstance(plain["llama.context_length"], int)


def test_gguf_through_safe_open_and_load_file():
    exp = expected("tiny-llama")
    with kiln.safe_open(str(GGUF)) as f:
        assert f.keys() == sorted(exp["order"])
        assert f.metadata()["general.architecture"] == "llama"
        a = f.get_tensor("blk.0.attn_norm.weight")
        assert a.dtype == np.float32 and a.shape == (64,)
    # ggml's block types have no numpy dtype: load_file says so and how to get the bytes
    with pytest.raises(TypeError, match="raw=True"):
        kiln.load_file(str(GGUF))


def test_gguf_alignment_is_told():
    with kiln.open(str(GGUF)) as d:
        for name in d.keys():
            t = d[name]
            assert t.alignment >= 32, name  # the file's general.alignment default
            assert t.address % t.alignment == 0


# --- safetensors -----------------------------------------------------------------------------

ST_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "F8_E4M3": "f8e4m3"}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("entry", ["index", "shard1", "shard2"])
def test_sharded_safetensors_are_the_reference_readers(source, entry):
    exp = expected("tiny-sharded")
    path = {"index": INDEX, "shard1": SHARDED / "model-00001-of-00002.safetensors",
            "shard2": SHARDED / "model-00002-of-00002.safetensors"}[entry]
    with kiln.open(str(path), source=source) as d:
        assert d.format == "safetensors"
        assert len(d.paths) == 2  # any entry opens the whole checkpoint
        assert sorted(d.keys()) == sorted(exp["order"])
        for name, (kind, shape, digest) in exp["tensors"].items():
            t = d[name]
            assert t.dtype == ST_DTYPES[kind.split(":", 1)[1]], name
            assert t.shape == tuple(shape), name
            assert sha(t) == digest, name
        # the shards' __metadata__, not the index's bookkeeping (total_size)
        assert d.metadata() == exp["metadata"]
        assert d.metadata(types=True) == {k: ("str", v) for k, v in exp["metadata"].items()}


def test_one_file_opens_a_shard_alone():
    one = SHARDED / "model-00001-of-00002.safetensors"
    with kiln.open(str(one), one_file=True) as d:
        assert len(d.paths) == 1
        assert 0 < len(d.keys()) < len(expected("tiny-sharded")["order"])


def test_safe_open_on_the_index_file():
    exp = expected("tiny-sharded")
    with kiln.safe_open(str(INDEX)) as f:
        assert f.keys() == sorted(exp["order"])
        assert f.metadata() == {"format": "pt"}
        a = f.get_tensor("model.layers.0.input_layernorm.weight")
        assert a.dtype == np.float32


def st_file(path, tensors, metadata=None, pad=0):
    """A safetensors file written by hand: tensors is [(name, dtype, shape, bytes)], in data
    order; pad spaces after the JSON move the data region off 8-byte alignment."""
    header, off, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    text = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return str(path)


def test_written_safetensors_zero_copy_and_aligned_copy(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, 2, 3], dtype=np.int16)
    # header length chosen so the data region starts at an odd address offset
    p = None
    for pad in range(8):
        p = st_file(tmp_path / "m.safetensors", [("b", "I16", b.shape, b.tobytes()),
                                                 ("w", "F32", w.shape, w.tobytes())],
                    {"note": "x"}, pad)
        with kiln.open(p) as d:
            if d["w"].alignment < 4:
                break
    with kiln.open(p) as d:
        t = d["w"]
        assert t.alignment < 4  # told, not assumed
        np.testing.assert_array_equal(t.numpy(), w)  # numpy copes with misaligned views
        assert d.metadata() == {"note": "x"}
    with kiln.open(p, align=True) as d:
        t = d["w"]
        assert t.alignment >= 4 and t.address % 4 == 0  # an owned, aligned copy
        np.testing.assert_array_equal(t.numpy(), w)
        assert d["b"].alignment >= 2


def test_safe_open_pt_aligns_for_torch(tmp_path):
    torch = pytest.importorskip("torch")
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    for pad in range(8):
        p = st_file(tmp_path / "t.safetensors", [("a", "U8", (1,), b"\x07"),
                                                 ("w", "F32", w.shape, w.tobytes())], None, pad)
        with kiln.open(p) as d:
            if d["w"].alignment < 4:
                break
    with kiln.safe_open(p, framework="pt") as f:
        t = f.get_tensor("w")
        assert isinstance(t, torch.Tensor)
        assert t.data_ptr() % 4 == 0
        assert t.tolist() == w.tolist()


def test_format_option(tmp_path):
    p = st_file(tmp_path / "f.safetensors", [("x", "U8", (2,), b"ab")])
    with kiln.open(p, format="safetensors") as d:
        assert d.format == "safetensors"
    with pytest.raises(kiln.FormatError):
        kiln.open(p, format="gguf")
    with pytest.raises(kiln.FrameError):
        kiln.open(p, format="klnt")
    with pytest.raises(ValueError):
        kiln.open(p, format="pickle")


# --- the formats' own defects, with class and location ----------------------------------------

def test_safetensors_duplicate_key_is_refused(tmp_path):
    text = (b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}')
    p = tmp_path / "dup.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + b"ab")
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(str(p))
    assert e.value.field == "name" and e.value.tensor == 1
    assert "twice" in str(e.value)


def test_safetensors_gap_is_refused(tmp_path):
    p = st_file(tmp_path / "gap.safetensors", [("x", "U8", (1,), b"a")])
    data = pathlib.Path(p).read_bytes() + b"z"  # a byte after the last tensor
    pathlib.Path(p).write_bytes(data)
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(p)
    assert e.value.field == "data_offsets"


def test_safetensors_header_past_the_cap_is_a_limit(tmp_path):
    p = tmp_path / "huge.bin"  # told from its bytes, not its name
    p.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(kiln.LimitError) as e:
        kiln.open(str(p))
    assert e.value.field == "header_length" and e.value.offset == 0


def test_a_file_named_for_a_format_gets_its_readers_verdict(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(kiln.FrameError, match="does not start with"):
        kiln.open(str(p))
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(kiln.FrameError, match="not a GGUF file"):
        kiln.open(str(p))
    p = tmp_path / "x.bin"
    p.write_bytes(b"GGML" + bytes(80))  # 64 bytes and more: shorter is KLNT's LIMIT
    with pytest.raises(kiln.FrameError, match="not a safetensors or GGUF"):
        kiln.open(str(p))


def test_safetensors_bad_utf8_is_utf8(tmp_path):
    text = b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    p = tmp_path / "u.safetensors"
    p.write_bytes(struct.pack("<Q", len(text)) + text + b"a")
    with pytest.raises(kiln.UTF8Error) as e:
        kiln.open(str(p))
    assert e.value.offset == 8 + 2


def gguf_bytes(kvs=(), tensors=(), version=3, align=32):
    """A GGUF file by hand: kvs [(key, type id, encoded value)], tensors [(name, ne, type,
    offset)], then the data section zero-filled to cover them."""
    def s(x):
        return struct.pack("<Q", len(x)) + x
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + v
    end = 0
    for name, ne, gtype, off in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", gtype, off)
        end = max(end, off + 4 * math.prod(ne))  # F32 only here
    out += b"\0" * ((-len(out)) % align)
    return out + b"\0" * end


def test_gguf_written_here_metadata_types(tmp_path):
    kvs = [(b"a.u8", 0, b"\x07"), (b"a.i16", 3, struct.pack("<h", -2)),
           (b"a.f64", 12, struct.pack("<d", 0.25)), (b"a.bool", 7, b"\x01"),
           (b"a.str", 8, struct.pack("<Q", 2) + b"hi"),
           (b"a.arr", 9, struct.pack("<IQ", 5, 2) + struct.pack("<ii", -1, 3)),
           (b"a.nest", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 8, 1) +
            struct.pack("<Q", 1) + b"z")]
    p = tmp_path / "m.gguf"
    p.write_bytes(gguf_bytes(kvs, [(b"w", (3, 2), 0, 0)]))
    with kiln.open(str(p)) as d:
        assert d.keys() == ["w"] and d["w"].shape == (2, 3)
        assert d.metadata(types=True) == {
            "a.u8": ("u8", 7), "a.i16": ("i16", -2), "a.f64": ("f64", 0.25),
            "a.bool": ("bool", True), "a.str": ("str", "hi"), "a.arr": ("arr:i32", [-1, 3]),
            "a.nest": ("arr:arr", [["z"]])}


def test_gguf_big_endian_is_a_frame_error(tmp_path):
    p = tmp_path / "be.gguf"
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(kiln.FrameError) as e:
        kiln.open(str(p))
    assert e.value.field == "version" and e.value.offset == 4
    assert "big-endian" in str(e.value)


def test_gguf_overlap_names_the_tensor(tmp_path):
    p = tmp_path / "o.gguf"
    p.write_bytes(gguf_bytes(tensors=[(b"a", (16,), 0, 0), (b"b", (16,), 0, 64)]))
    with kiln.open(str(p)) as d:
        assert d.keys() == ["a", "b"]
    p.write_bytes(gguf_bytes(tensors=[(b"a", (16,), 0, 0), (b"b", (16,), 0, 64),
                                      (b"c", (16,), 0, 96)]))
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(str(p))
    assert e.value.field == "offset" and e.value.tensor == 2
    assert "overlap" in str(e.value)


def test_gguf_huge_array_count_is_a_limit_in_one_kib(tmp_path):
    kv = (b"v", 9, struct.pack("<IQ", 8, 1 << 60))
    data = gguf_bytes([kv])
    p = tmp_path / "h.gguf"
    p.write_bytes(data + b"\0" * (1024 - len(data)))
    with pytest.raises(kiln.LimitError) as e:
        kiln.open(str(p))
    assert e.value.field == "value"
