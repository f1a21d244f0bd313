# SPDX-License-Identifier: MIT
"""kiln.cuda: tensors loaded into GPU memory by kiln's pipeline, as DLPack views (kDLCUDA),
checked without a CUDA-enabled torch: each view's device, its address as the CUDA runtime sees
it, its capsule's fields, and its bytes read back against the file's. Without a GPU, what can be
checked is the refusal: no adapter built, or no usable device, each a clear error."""

import ctypes
import os

import numpy as np
import pytest

import kiln
import kiln.cuda as kc

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                       "samples")


def _gpus():
    if not kc.available():
        return 0
    return kc.device_count()


GPUS = _gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no usable CUDA device (or no CUDA adapter)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("cuda") / "m.klnt")
    rng = np.random.default_rng(3)
    kiln.save_file({"a": rng.standard_normal((64, 33)).astype(np.float32),
                    "b": rng.integers(0, 255, 1000, dtype=np.uint8),
                    "c": np.zeros((0, 4), np.float16),
                    "d": rng.integers(-9, 9, (7, 5, 3), dtype=np.int64)}, p)
    return p


def test_without_the_adapter_or_a_gpu_the_error_says_so(model):
    if GPUS:
        pytest.skip("a GPU is usable here")
    if not kc.available():
        with pytest.raises(RuntimeError, match="without the CUDA adapter"):
            kc.load(model)
    else:
        with pytest.raises(kiln.Error, match="no usable CUDA device"):
            kc.load(model)
    assert kc.device_count() == 0


def test_load_arguments_are_checked(model):
    with kiln.open(model, directory_only=True) as d:
        with pytest.raises(ValueError, match="arena=True"):
            d.load([d[0]], device=object())
        with pytest.raises(ValueError, match="place= needs device="):
            d.load([d[0]], arena=True, place=0)
        with pytest.raises(ValueError):
            d.load([d[0]], arena=True, device=object())  # not a kiln.device capsule
    with kiln.open(model) as d:  # registration is for a device's copies, not host memory
        with pytest.raises(kiln.Error, match="host memory has nothing to register"):
            d.load([d[0]], arena=True, register=True)
    with pytest.raises(ValueError, match="cuda:N"):
        kc.load(model, device="cpu")


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _fields(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    return (t.data, t.device_type, t.device_id, [t.shape[i] for i in range(t.ndim)],
            (t.code, t.bits))


@needs_gpu
@pytest.mark.parametrize("register", [False, True])
@pytest.mark.parametrize("source", ["m", "tiny-llama.gguf",
                                    "tiny-sharded/model.safetensors.index.json"])
def test_views_are_on_the_gpu_with_the_files_bytes(model, source, register):
    path = model if source == "m" else os.path.join(SAMPLES, source)
    views = kc.load(path, register=register)
    with kiln.open(path) as d:
        assert list(views) == [t.name for t in d]
        for t in d:
            v = views[t.name]
            assert v.__dlpack_device__() == (2, 0)
            assert v.nbytes == t.nbytes and v.tensor.shape == t.shape
            if t.nbytes:
                assert kiln._kiln.cuda_pointer(v.address) == (2, 0)  # device memory
            assert kc.to_host(v) == t.copy(raw=True).tobytes()
            data, dev_type, dev_id, shape, _ = _fields(v.to_dlpack(raw=True))
            assert (dev_type, dev_id, shape) == (2, 0, [t.nbytes])
            assert data == v.address or t.nbytes == 0
            if t.dtype in ("f32", "u8", "i64", "f16", "bf16"):
                assert _fields(v.__dlpack__())[3] == list(t.shape)


@needs_gpu
def test_dlpack_requests_a_view_cannot_meet(model):
    v = kc.load(model)["a"]
    with pytest.raises(BufferError):
        v.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        v.__dlpack__(dl_device=(1, 0))
    assert _fields(v.__dlpack__(dl_device=(2, 0)))[1] == 2


@needs_gpu
def test_views_outlive_the_model_and_placement_by_name(model):
    views = kc.load(model, device={"a": 0, "*": GPUS - 1}, order=["d"])
    assert list(views) == ["a", "b", "c", "d"]  # file order, whatever the load order
    assert views["a"].__dlpack_device__() == (2, 0)
    assert views["d"].__dlpack_device__() == (2, GPUS - 1)
    with kiln.open(model) as d:
        assert kc.to_host(views["d"]) == d["d"].copy().tobytes()
