# SPDX-License-Identifier: MIT
"""kiln.safetensors as a drop-in for the safetensors package: the bytes its writer produces
(derived here from the format's layout rules by an independent encoder), the reading API's
arguments, errors and messages, slicing semantics, and the torch helpers."""

import json
import os
import struct
import threading
import time

import numpy as np
import pytest

import kiln
import kiln.safetensors as st
import kiln.safetensors.numpy as stnp

torch = pytest.importorskip("torch")
import kiln.safetensors.torch as stpt  # noqa: E402

# The reference's Dtype enum, in order; its writer puts the widest (last) first.
ENUM = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
        "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
        "F64", "I64", "U64"]
NP_CODE = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
           "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32",
           "complex64": "C64", "float64": "F64", "int64": "I64", "uint64": "U64"}


def expected_file(tensors, metadata=None):
    """The file the layout rules give: tensors (name -> (code, shape, bytes)) ordered by dtype
    widest first then name, compact JSON as serde_json writes it (Python's json with these
    options escapes the same way), __metadata__ first (keys in order), spaces to 8."""
    order = sorted(tensors, key=lambda n: (-ENUM.index(tensors[n][0]), n))
    parts, data, at = [], b"", 0
    if metadata is not None:
        meta = {k: metadata[k] for k in sorted(metadata)}
        parts.append('"__metadata__":' + json.dumps(meta, ensure_ascii=False,
                                                    separators=(",", ":")))
    for n in order:
        code, shape, raw = tensors[n]
        entry = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        parts.append(json.dumps(n, ensure_ascii=False) + ":" +
                     json.dumps(entry, separators=(",", ":")))
        at += len(raw)
        data += raw
    header = ("{" + ",".join(parts) + "}").encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def np_expected(arrays, metadata=None):
    return expected_file({k: (NP_CODE[v.dtype.name], v.shape,
                              np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes())
                          for k, v in arrays.items()}, metadata)


def test_known_file_from_the_rules():
    # The JSON is 60 bytes: 4 spaces make the header 64 (0x40), then the 16 data bytes.
    out = stnp.save({"test": np.zeros((2, 2), dtype=np.int32)})
    assert out == (b"@" + bytes(7) + b'{"test":{"dtype":"I32","shape":[2,2],'
                   b'"data_offsets":[0,16]}}    ' + bytes(16))


def test_every_dtype_order_names_metadata_and_escapes(tmp_path):
    rng = np.random.default_rng(5)
    arrays = {}
    for i, dt in enumerate(["bool", "uint8", "int8", "int16", "uint16", "float16", "int32",
                            "uint32", "float32", "complex64", "float64", "int64", "uint64"]):
        arrays[f"t{12 - i:02d}"] = rng.integers(0, 2, size=(3, i % 3 + 1)).astype(dt)
    arrays["B"] = np.arange(3, dtype=np.float32)  # sorts before "t.." within F32
    arrays['q"\\\n\x01/é'] = np.zeros(2, dtype=np.uint8)
    arrays["scalar"] = np.asarray(7, dtype=np.int64)
    arrays["empty"] = np.zeros((2, 0), dtype=np.float16)
    meta = {"zeta": "1", "alpha": 'tab\tquote"', "ключ": "значение"}
    want = np_expected(arrays, meta)
    assert stnp.save(arrays, metadata=meta) == want
    assert stnp.save(dict(reversed(list(arrays.items()))), metadata=meta) == want
    p = tmp_path / "all.safetensors"
    stnp.save_file(arrays, p, metadata=meta)
    assert p.read_bytes() == want
    back = stnp.load_file(p)
    assert list(back) == [t for t in json.loads(want[8:8 + struct.unpack("<Q", want[:8])[0]])
                          if t != "__metadata__"]
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k], v)


def test_big_endian_and_strided_arrays_are_written_in_file_order():
    a = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    want = np_expected({"a": a.astype("<i4"), "s": np.ascontiguousarray(strided)})
    assert stnp.save({"a": a, "s": strided}) == want


def test_torch_save_matches_numpy_bytes_and_bf16_bool():
    t = {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
         "b": torch.tensor([True, False]), "h": torch.ones(2, dtype=torch.bfloat16) * 2.25}
    want = expected_file({"x": ("F32", [2, 3], t["x"].numpy().tobytes()),
                          "b": ("BOOL", [2], b"\x01\x00"),
                          "h": ("BF16", [2], b"\x10@\x10@")})
    assert stpt.save(t) == want
    back = stpt.load(want)
    assert back["h"].dtype == torch.bfloat16 and torch.equal(back["h"], t["h"])
    assert torch.equal(back["b"], t["b"]) and torch.equal(back["x"], t["x"])


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"),
                    reason=f"torch {torch.__version__} has no float8 types (2.1+)")
def test_float8_round_trip(tmp_path):
    t = {"a": torch.tensor([-0.5, 0.5]).to(torch.float8_e4m3fn),
         "b": torch.tensor([-0.5, 0.5]).to(torch.float8_e5m2)}
    p = tmp_path / "f8.safetensors"
    stpt.save_file(t, p)
    with st.safe_open(p, "pt") as f:
        assert [f.get_slice(k).get_dtype() for k in ("a", "b")] == ["F8_E4M3", "F8_E5M2"]
    back = stpt.load_file(p)
    for k in t:
        assert back[k].dtype == t[k].dtype
        assert torch.equal(back[k].view(torch.uint8), t[k].view(torch.uint8))


def test_metadata_none_empty_and_given(tmp_path):
    p = tmp_path / "m.safetensors"
    stnp.save_file({"a": np.zeros(1)}, p)
    with st.safe_open(p, "np") as f:
        assert f.metadata() is None
    stnp.save_file({"a": np.zeros(1)}, p, metadata={})
    assert b'"__metadata__":{}' in p.read_bytes()
    with st.safe_open(p, "np") as f:
        assert f.metadata() == {}
    stnp.save_file({"a": np.zeros(1)}, p, metadata={"k": "v"})
    with st.safe_open(p, "np") as f:
        assert f.metadata() == {"k": "v"}
    with pytest.raises(TypeError, match="argument 'metadata': 'int' object is not an instance "
                                        "of 'str'"):
        stnp.save({"a": np.zeros(1)}, metadata={"k": 1})


def test_tensorspec_rules():
    with pytest.raises(st.SafetensorError, match=r'^Unknown dtype "nonsense"\. Supported dtypes: '
                                                 r"bool, int8, .*, complex64$"):
        st.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(st.SafetensorError):
        st.TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=0)  # codes are not names
    s = st.TensorSpec(dtype="float4_e2m1fn_x2", shape=(3, 2), data_ptr=5, data_len=6)
    assert s.dtype == "F4" and s.shape == [3, 4] and s.data_ptr == 5 and s.data_len == 6
    assert repr(st.TensorSpec(dtype="float32", shape=[2, 3], data_ptr=1234, data_len=24)) == \
        "TensorSpec(dtype='F32', shape=[2, 3], data_ptr=1234, data_len=24)"
    with pytest.raises(AttributeError):
        s.dtype = "F32"
    with pytest.raises(OverflowError):
        st.TensorSpec(dtype="uint8", shape=[-1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):
        st.serialize({"t": {"dtype": "float32", "shape": [1], "data_ptr": 0, "data_len": 0}})
    with pytest.raises(TypeError, match="argument 'tensor_dict'"):
        st.serialize([("t", s)])


def test_serialize_refusals_carry_safetensors_texts():
    buf = np.zeros(16, dtype=np.uint8)
    bad_len = st.TensorSpec(dtype="float32", shape=[4], data_ptr=buf.ctypes.data, data_len=15)
    with pytest.raises(st.SafetensorError, match="^Error while serializing: invalid shape, data "
                                                 "type, or offset for tensor$"):
        st.serialize({"t": bad_len})
    odd = st.TensorSpec(dtype="float4_e2m1fn_x2", shape=[], data_ptr=buf.ctypes.data,
                        data_len=1)
    with pytest.raises(st.SafetensorError, match="^Error while serializing: The slice is slicing "
                                                 "for subbytes dtypes"):
        st.serialize({"t": odd})
    with pytest.raises(st.SafetensorError, match="at most 8"):
        st.serialize({"t": st.TensorSpec(dtype="uint8", shape=[1] * 9,
                                         data_ptr=buf.ctypes.data, data_len=1)})
    with pytest.raises(st.SafetensorError, match="^Error while serializing: I/O error: "):
        st.serialize_file({}, "/nonexistent-dir/x.safetensors")


def test_deserialize_list_and_errors():
    raw = expected_file({"b": ("U8", [2], b"\x01\x02"), "a": ("F32", [1], b"\0\0\x80?")})
    out = st.deserialize(raw)
    assert [n for n, _ in out] == ["a", "b"]
    assert out[1][1] == {"shape": [2], "dtype": "U8", "data": bytearray(b"\x01\x02")}
    with pytest.raises(TypeError, match="argument 'bytes': 'bytearray' object is not an "
                                        "instance of 'bytes'"):
        st.deserialize(bytearray(raw))
    with pytest.raises(st.SafetensorError, match="^Error while deserializing: "):
        st.deserialize(raw[:-1])


def test_open_arguments_and_messages(tmp_path):
    p = tmp_path / "a.safetensors"
    stnp.save_file({"a": np.arange(3, dtype=np.int16)}, p)
    with pytest.raises(st.SafetensorError, match="^framework foo is invalid$"):
        st.safe_open(p, "foo")
    with pytest.raises(TypeError, match="argument 'framework'"):
        st.safe_open(p, 1)
    with pytest.raises(st.SafetensorError, match=r'^backend "no" is invalid \(expected one of: '
                                                 r'"mmap", "pread"\)$'):
        st.safe_open(p, "np", backend="no")
    for bad, cls, text in [("gpu", st.SafetensorError, "device gpu is invalid"),
                           ("cuda:0:1", st.SafetensorError, "device cuda:0:1 is invalid"),
                           ("cuda:x", ValueError, "invalid digit found in string"),
                           ("mps:1", st.SafetensorError,
                            "device mps:1 is invalid: only mps or mps:0 is supported"),
                           (-1, st.SafetensorError, "device -1 is invalid")]:
        with pytest.raises(cls) as e:
            st.safe_open(p, "np", device=bad)
        assert str(e.value) == text
    with pytest.raises(st.SafetensorError, match="^Device cuda:0 is not supported for "
                                                 "framework numpy$"):
        st.safe_open(p, "np", device="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(st.SafetensorError, match="device cuda:1 is not usable"):
            st.safe_open(p, "pt", device="cuda:1")
    with pytest.raises(FileNotFoundError) as e:
        st.safe_open(str(tmp_path / "missing"), "np")
    assert str(e.value) == f"No such file or directory: {tmp_path / 'missing'}"


def test_handle_lifecycle_keys_and_missing_tensor(tmp_path):
    p = tmp_path / "a.safetensors"
    stnp.save_file({"z": np.zeros(4, np.int8), "a": np.ones(2, np.float64)}, p)
    with st.safe_open(p, "np") as f:
        assert f.keys() == ["a", "z"] and f.offset_keys() == ["a", "z"]
        with pytest.raises(st.SafetensorError, match="^File does not contain tensor nope$"):
            f.get_tensor("nope")
        with pytest.raises(st.SafetensorError, match="^File does not contain tensor nope$"):
            f.get_slice("nope")
        a = f.get_tensor("a")
        s = f.get_slice("z")
    for call in (f.keys, f.metadata, f.offset_keys, f.get_tensors, lambda: f.get_tensor("a")):
        with pytest.raises(st.SafetensorError, match="^File is closed$"):
            call()
    # What was handed out stays valid; the slice object still works after the handle closed.
    np.testing.assert_array_equal(a, np.ones(2))
    assert s[1:3].shape == (2,)
    # The file can be replaced while the old tensors are alive (they keep the old pages).
    stnp.save_file({"a": np.full(2, 5.0)}, p)
    np.testing.assert_array_equal(a, np.ones(2))


def test_numpy_tensors_are_writable_private_views(tmp_path):
    p = tmp_path / "w.safetensors"
    stnp.save_file({"a": np.zeros(4, np.float32)}, p)
    with st.safe_open(p, "np") as f:
        a = f.get_tensor("a")
        a[0] = 3
    with st.safe_open(p, "np") as f:
        assert f.get_tensor("a")[0] == 0  # never the file


def test_native_slicing_rules_and_messages(tmp_path):
    A = np.arange(50, dtype=np.float64).reshape(10, 5)
    p = tmp_path / "s.safetensors"
    stnp.save_file({"a": A}, p)
    for fw, backend in [("np", "mmap"), ("np", "pread"), ("pt", "pread")]:
        with st.safe_open(p, fw, backend=backend) as f:
            s = f.get_slice("a")
            assert s.get_shape() == [10, 5] and s.get_dtype() == "F64"
            got = lambda k: np.asarray(s[k])  # noqa: E731
            np.testing.assert_array_equal(got(slice(None)), A)
            np.testing.assert_array_equal(got(()), A)
            np.testing.assert_array_equal(got((slice(2, None), -1)), A[2:, -1])
            np.testing.assert_array_equal(got((0, slice(None, 2))), A[0, :2])
            assert got([]).shape == (0, 5)
            # Steps are not applied; indices past the rank are dropped.
            np.testing.assert_array_equal(got(slice(None, None, 2)), A)
            np.testing.assert_array_equal(got((1, 2, 3)), A[1, 2])
            for key, text in [
                ((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 5"),
                ([0, 1], "Non empty lists are not implemented"),
                ((slice(2, None), 20), "Error during slicing [2:, 20] with shape [10, 5]: index "
                                       "20 out of bounds for tensor dimension #1 of size 5"),
                (slice(None, 20), "Error during slicing [:20] with shape [10, 5]: index 19 out "
                                  "of bounds for tensor dimension #0 of size 10"),
                ((slice(11, None), slice(None, 9)),  # both out of range: the last is told
                 "Error during slicing [11:, :9] with shape [10, 5]: index 8 out of bounds for "
                 "tensor dimension #1 of size 5"),
            ]:
                with pytest.raises(st.SafetensorError) as e:
                    s[key]
                assert str(e.value) == text
            with pytest.raises(TypeError):
                s[..., 1]
            with pytest.raises(OverflowError):
                s[-3:]
            out = s[1:3]
            out[0, 0] = -1  # a copy
            assert np.asarray(s[1:3])[0, 0] == A[1, 0]


def test_torch_slicing_over_a_mapping_is_torchs(tmp_path):
    A = torch.arange(50, dtype=torch.float32).reshape(10, 5)
    p = tmp_path / "t.safetensors"
    stpt.save_file({"a": A}, p)
    with st.safe_open(p, "pt") as f:
        s = f.get_slice("a")
        assert torch.equal(s[::2, -2:], A[::2, -2:])
        assert torch.equal(s[..., 1], A[..., 1])
        assert s[[]].shape == (0, 5)
        with pytest.raises(IndexError):
            s[2:, 20]


def test_torch_refusals():
    with pytest.raises(ValueError) as e:
        stpt.save({"test": torch.zeros(2).to_sparse()})
    assert str(e.value).startswith("You are trying to save a sparse tensors: `['test']` which")
    with pytest.raises(ValueError, match="^Key `test` is invalid, expected torch.Tensor but "
                                         "received <class 'dict'>$"):
        stpt.save({"test": {}})
    with pytest.raises(ValueError, match="^Expected a dict of"):
        stpt.save("nope")
    A = torch.zeros(4, 4)
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        stpt.save({"A": A, "B": A[:1]})
    stpt.save({"A": A[:2], "B": A[2:]})  # disjoint views of one storage are fine
    with pytest.raises(ValueError, match="non contiguous tensor: `t`"):
        stpt.save({"t": torch.zeros(3, 4).t()})
    with pytest.raises(RuntimeError, match="Cannot copy out of meta tensor"):
        stpt.save({"m": torch.zeros(2, device="meta")})


def test_storage_helpers_and_duplicate_names():
    A = torch.zeros((4, 4))
    assert stpt._is_complete(A) and not stpt._is_complete(A[:1]) and not stpt._is_complete(A[::2])
    assert stpt._find_shared_tensors({"A": A, "B": A[:1]}) == [{"A", "B"}]
    assert stpt._find_shared_tensors({"B": A[:2], "C": A[2:], "D": A[:1]}) == [{"B", "D"}, {"C"}]
    z = torch.zeros(16)[::4]
    assert stpt._end_ptr(z) - z.data_ptr() == 52
    assert stpt._remove_duplicate_names({"A": A, "B": A, "C": A[:1]}) == {"A": ["B", "C"]}
    with pytest.raises(RuntimeError, match="no suitable name to keep"):
        stpt._remove_duplicate_names({"B": A[:1]})
    m = torch.randn(10)
    assert stpt.storage_size(m) == 40 and stpt.storage_ptr(m) == m.data_ptr()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = self.a


class Untied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)


def test_save_model_and_load_model(tmp_path):
    p = tmp_path / "model.safetensors"
    m = Tied()
    with pytest.raises(RuntimeError):
        stpt.save_file(m.state_dict(), p)
    stpt.save_model(m, p)
    with st.safe_open(p, "pt") as f:
        assert f.metadata() == {"b.bias": "a.bias", "b.weight": "a.weight"}
        assert f.keys() == ["a.bias", "a.weight"]
    m2 = Tied()
    missing, unexpected = stpt.load_model(m2, p)
    assert missing == set() and unexpected == []
    assert torch.equal(m2.a.weight, m.a.weight)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "b.bias", '
                                           '"b.weight"'):
        stpt.load_model(Untied(), p)
    stpt.load_model(Untied(), p, strict=False)


def test_pread_and_mmap_agree_and_get_tensors_in_file_order(tmp_path):
    t = {"f": torch.randn(3, 4), "h": torch.randn(2, 2).half(), "e": torch.zeros(0, 5),
         "s": torch.tensor(7.5), "i": torch.arange(5), "bf": torch.randn(2, 4).bfloat16()}
    p = tmp_path / "p.safetensors"
    stpt.save_file(t, p, metadata={"foo": "bar"})
    a = stpt.load_file(p)
    b = stpt.load_file(p, backend="pread")
    # File order: I64, then the F32 ones by name, BF16, F16.
    assert list(a) == list(b) == ["i", "e", "f", "s", "bf", "h"]
    for k in t:
        assert a[k].dtype == b[k].dtype == t[k].dtype and torch.equal(a[k], t[k])
        assert torch.equal(b[k], t[k])
    with st.safe_open(p, "pt", backend="pread") as f:
        assert f.metadata() == {"foo": "bar"}


def test_safe_open_handle_text_binary_and_fsspec(tmp_path):
    p = tmp_path / "h.safetensors"
    stnp.save_file({"a": np.arange(3)}, p)
    for mode in ("r", "rb"):
        with open(p, mode) as fh, st._safe_open_handle(fh, framework="np") as f:
            np.testing.assert_array_equal(f.get_tensor("a"), np.arange(3))
    import io

    with pytest.raises(AttributeError):
        st._safe_open_handle(io.BytesIO(b""), "np")
    fsspec = pytest.importorskip("fsspec", reason="python3-fsspec is not installed")
    fs = fsspec.filesystem("file")
    with fs.open(str(p), "rb") as fh, st._safe_open_handle(fh, "np") as f:
        assert f.keys() == ["a"]


def test_stock_and_native_formats_open_too(tmp_path):
    p = tmp_path / "n.klnt"
    kiln.save_file({"w": np.arange(4, dtype=np.float32)}, p, metadata={"k": "v"})
    with st.safe_open(p, "pt") as f:
        assert f.keys() == ["w"] and f.metadata() == {"k": "v"}
        assert f.get_slice("w").get_dtype() == "F32"


def test_serialize_file_releases_the_gil(tmp_path):
    # While one thread is inside serialize (a 256 MiB copy), another runs Python code.
    big = np.ones(256 << 20, dtype=np.uint8)
    spec = {"big": st.TensorSpec(dtype="uint8", shape=big.shape, data_ptr=big.ctypes.data,
                                 data_len=big.nbytes)}
    window = []

    def work():
        t0 = time.monotonic()
        st.serialize_file(spec, tmp_path / "big.safetensors")
        window.extend([t0, time.monotonic()])

    ticks = []
    th = threading.Thread(target=work)
    th.start()
    while th.is_alive():
        ticks.append(time.monotonic())
        time.sleep(0.001)
    th.join()
    t0, t1 = window
    inside = [t for t in ticks if t0 < t < t1]
    assert t1 - t0 < 0.01 or len(inside) >= 2, (t1 - t0, len(inside))
    with open(tmp_path / "big.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    assert os.path.getsize(tmp_path / "big.safetensors") == 8 + n + big.nbytes
    os.remove(tmp_path / "big.safetensors")  # 256 MiB: not left in pytest's kept runs


SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")


def test_gguf_and_one_shard_open_as_one_file():
    with st.safe_open(os.path.join(SAMPLES, "tiny-llama.gguf"), "np") as f:
        meta = f.metadata()
        assert meta["general.architecture"] == "llama"
        assert meta["llama.context_length"] == "256"  # typed values as JSON text
        assert f.keys()
    # A shard of a sharded checkpoint is one file here, as in safetensors (kiln.open would
    # open both shards).
    shard = os.path.join(SAMPLES, "tiny-sharded", "model-00001-of-00002.safetensors")
    with st.safe_open(shard, "np") as f:
        one = set(f.keys())
    with kiln.open(shard) as d:
        both = set(d.keys())
    assert one and one < both


def test_load_file_onto_a_gpu_goes_through_kiln_torch_load(tmp_path, monkeypatch):
    p = str(tmp_path / "m.safetensors")
    stpt.save_file({"a": torch.ones(3)}, p)
    import kiln.torch as kt

    seen = []
    cuda = torch.cuda.is_available()
    monkeypatch.setattr(kt, "load", lambda path, device="cpu", **kw: seen.append(
        (path, str(device), kw)) or {"a": torch.ones(3)})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for dev in ("cuda", "cuda:1", 0, 3):
        assert list(stpt.load_file(p, device=dev)) == ["a"]
    assert list(stpt.load_file(p, device=2, verify=True)) == ["a"]
    no = {"verify": False}
    assert seen == [(p, "cuda:0", no), (p, "cuda:1", no), (p, "cuda:0", no), (p, "cuda:3", no),
                    (p, "cuda:2", {"verify": True})]
    assert stpt.load_file(p)["a"].device.type == "cpu" and len(seen) == 5  # cpu: the mapping
    assert stpt.load_file(p, device=None)["a"].device.type == "cpu"
    with pytest.raises(st.SafetensorError, match="invalid"):
        stpt.load_file(p, device="cuda:1:2")  # safetensors' own refusal, before any load
    assert len(seen) == 5
    monkeypatch.undo()
    if not cuda:
        # Without CUDA in torch: safe_open's error, as the drop-in gives it.
        with pytest.raises(st.SafetensorError, match="not usable"):
            stpt.load_file(p, device="cuda")


def test_numpy_scalars_and_0d_arrays_are_saved_as_safetensors_does():
    """A numpy scalar is a 0-d array (safetensors' _tobytes takes both); it used to raise
    AttributeError."""
    import numpy as np
    import kiln.safetensors.numpy as stnp

    scalar = stnp.save({"a": np.float32(3.0), "b": np.int64(-2)})
    zero_d = stnp.save({"a": np.array(3.0, dtype=np.float32), "b": np.array(-2, dtype=np.int64)})
    assert scalar == zero_d
    back = stnp.load(scalar)
    assert back["a"].shape == () and back["a"] == np.float32(3.0)
    assert back["b"].dtype == np.int64 and back["b"] == -2
