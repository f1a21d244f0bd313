# SPDX-License-Identifier: MIT
"""safe_open and _safe_open_handle of kiln.safetensors: safetensors' reading API over a kiln
model of one file (kiln.open(one_file=True)), with safetensors' argument rules, errors and
slicing semantics."""

import json as _json

from .. import METADATA_TENSOR as _METADATA_TENSOR
from .. import _kiln
from .._kiln import Error as _KilnError
from .._kiln import FileError as _KilnFileError
from . import SafetensorError, _debug_str, _not_instance, _path, _st_dtype

_FRAMEWORKS = {"pt": "pytorch", "torch": "pytorch", "pytorch": "pytorch", "np": "numpy",
               "numpy": "numpy", "tf": "tensorflow", "tensorflow": "tensorflow",
               "jax": "flax", "flax": "flax", "mlx": "mlx", "paddle": "paddle"}
# backend= names and the kiln source behind each (docs/python.md).
_BACKENDS = {"mmap": "mmap", "pread": "read"}
_INDEXED = ("cuda", "musa", "npu", "xpu", "xla", "mlu", "hpu")

# Header code -> the numpy / torch dtype attribute (safetensors' table).
_ATTR = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
         "U64": "uint64", "I64": "int64", "U32": "uint32", "I32": "int32", "U16": "uint16",
         "I16": "int16", "U8": "uint8", "I8": "int8", "BOOL": "bool",
         "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
         "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz",
         "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2", "C64": "complex64"}
# Dtypes kiln's numpy() and DLPack give directly (no reinterpretation of raw bytes).
_NUMPY_NATIVE = {"F64", "F32", "F16", "U64", "I64", "U32", "I32", "U16", "I16", "U8", "I8",
                 "BOOL"}
_TORCH_NATIVE = {"F64", "F32", "F16", "I64", "I32", "I16", "U8", "I8"}


def _device(device):
    """safetensors' device argument: (display name, what torch is given), or raises."""
    if device is None:
        return "cpu", "cpu"
    if isinstance(device, str):
        if device == "cpu":
            return "cpu", "cpu"
        if device == "mps":
            return "mps", "mps"
        if device in _INDEXED:
            return f"{device}:0", f"{device}:0"
        kind, sep, rest = device.partition(":")
        if sep and (kind in _INDEXED or kind == "mps"):
            if ":" in rest:
                raise SafetensorError(f"device {device} is invalid")
            digits = rest[1:] if rest.startswith("+") else rest
            if not rest:
                raise ValueError("cannot parse integer from empty string")
            if not digits.isascii() or not digits.isdigit():
                raise ValueError("invalid digit found in string")
            n = int(digits)
            if n >= 1 << 64:
                raise ValueError("number too large to fit in target type")
            if kind == "mps":
                if n:
                    raise SafetensorError(f"device {device} is invalid: only mps or mps:0 is "
                                          f"supported")
                return "mps", "mps"
            return f"{kind}:{n}", f"{kind}:{n}"
        raise SafetensorError(f"device {device} is invalid")
    try:
        import operator

        n = operator.index(device)
    except TypeError:
        n = None
    if n is None or n < 0 or n >= 1 << 64:
        raise SafetensorError(f"device {device!r} is invalid")
    return str(n), n


class _Open:
    """What safe_open and _safe_open_handle share."""

    def _start(self, filename, framework, device, backend):
        if not isinstance(framework, str):
            raise _not_instance("framework", framework, "str")
        fw = _FRAMEWORKS.get(framework)
        if fw is None:
            raise SafetensorError(f"framework {framework} is invalid")
        shown, torch_device = _device(device)
        if not isinstance(backend, str):
            raise _not_instance("backend", backend, "str")
        source = _BACKENDS.get(backend)
        if source is None:
            raise SafetensorError(f"backend {_debug_str(backend)} is invalid (expected one "
                                  f'of: "mmap", "pread")')
        try:
            # One file, whatever its name says (a shard of a series opens alone), any format;
            # copies of the few tensors misaligned for their dtype, the rest zero-copy.
            d = _kiln.open(filename, source=source, one_file=True, align=True)
        except _KilnFileError:
            raise FileNotFoundError(f"No such file or directory: {filename}") from None
        except _KilnError as e:
            raise SafetensorError(f"Error while deserializing header: {e}") from None
        if shown != "cpu" and fw not in ("pytorch", "paddle"):
            d.close()
            raise SafetensorError(f"Device {shown} is not supported for framework {fw}")
        self._dir = d
        self._framework = fw
        self._backend = backend
        self._device = None if shown == "cpu" else torch_device
        self._shown = shown
        self._filename = filename
        if fw == "pytorch":
            import torch

            if self._device is not None:
                try:
                    torch.empty(0).to(self._device)
                except Exception as e:  # noqa: BLE001 (torch raises several kinds)
                    d.close()
                    self._dir = None
                    raise SafetensorError(f"device {shown} is not usable in PyTorch "
                                          f"{torch.__version__}: {e}") from None
        elif fw == "paddle":
            import paddle  # noqa: F401 (as safetensors: the framework must exist)

    def _live(self):
        if self._dir is None:
            raise SafetensorError("File is closed")
        return self._dir

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        # The tensors handed out keep the mapping until they are gone; the handle does not.
        if self._dir is not None:
            self._dir.close()
            self._dir = None

    def _views(self):
        return [t for t in self._live() if t.name is not None and t.name != _METADATA_TENSOR]

    def keys(self):
        """The names of the tensors, sorted."""
        return sorted(t.name for t in self._views())

    def offset_keys(self):
        """The names of the tensors in the order of their bytes in the file."""
        return [t.name for t in sorted(self._views(), key=lambda t: (t.file_offset, t.name))]

    def metadata(self):
        """The file's __metadata__ (str -> str), or None when it has none. A GGUF file's
        (or a KLNT document's) typed values are given as JSON text."""
        d = self._live()
        meta = d.metadata()
        if not meta:
            return {} if meta is not None and self._has_empty_metadata(d) else None
        return {k: v if isinstance(v, str) else _json.dumps(v, ensure_ascii=False)
                for k, v in meta.items()}

    def _has_empty_metadata(self, d):
        """Whether a safetensors header says "__metadata__": {} (kiln keeps no entry for it);
        the header was validated at open, so a plain parse of it is safe."""
        if d.format != "safetensors":
            return False
        with open(d.paths[0], "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = _json.loads(f.read(n))
        return isinstance(header.get("__metadata__"), dict)

    def _view(self, name):
        if not isinstance(name, str):
            raise _not_instance("name", name, "str")
        d = self._live()
        try:
            t = d[name]
        except KeyError:
            t = None
        if t is None or name == _METADATA_TENSOR:
            raise SafetensorError(f"File does not contain tensor {name}")
        return t

    def get_tensor(self, name):
        """The whole tensor: a zero-copy view of the file's private mapping (or of the block
        read at open with backend="pread")."""
        return _make(self, self._view(name))

    def get_tensors(self):
        """Every tensor, by name, in the order of their bytes in the file."""
        return {t.name: _make(self, t)
                for t in sorted(self._views(), key=lambda t: (t.file_offset, t.name))}

    def get_slice(self, name):
        """A slice object: ``get_shape()``, ``get_dtype()``, and ``[...]`` for part of it."""
        return _SafeSlice(self, self._view(name))


class safe_open(_Open):  # noqa: N801 (safetensors' name)
    """``safe_open(filename, framework, device="cpu", *, backend="mmap")``, as in safetensors:
    the tensors of one file, on demand. ``framework``: "pt"/"torch"/"pytorch", "np"/"numpy"
    (and "tf", "flax", "mlx", "paddle" when installed); ``backend``: "mmap" (kiln's mmap
    source) or "pread" (kiln's read source). Any format kiln reads opens: safetensors, KLNT,
    GGUF."""

    def __init__(self, filename, framework, device="cpu", *, backend="mmap"):
        self._dir = None
        self._start(_path("filename", filename), framework, device, backend)


class _safe_open_handle(_Open):  # noqa: N801 (safetensors' name)
    """``_safe_open_handle(f, framework, device="cpu", *, backend="mmap")``: safe_open of the
    file an open file object names (``f.name``; ``f.fileno`` must exist), in text or binary mode,
    or a local fsspec file. The file is opened again by its name."""

    def __init__(self, f, framework, device="cpu", *, backend="mmap"):
        self._dir = None
        getattr(f, "fileno")  # as safetensors: a handle with no descriptor is refused here
        self._start(_path(None, f.name), framework, device, backend)


def _numpy_of(t, code):
    import numpy as np

    if code in _NUMPY_NATIVE:
        return t.numpy(writable=True)
    if code == "BF16":
        dtype = np.dtype("bfloat16")  # numpy's own TypeError without ml_dtypes, as upstream
    elif code in ("F6_E2M3", "F6_E3M2"):
        raise SafetensorError(f"Dtype not understood: {code}")
    else:
        dtype = getattr(np, _ATTR[code])
    return t.numpy(raw=True, writable=True).view(dtype).reshape(t.shape)


def _torch_of(t, code):
    import torch

    if code in ("F6_E2M3", "F6_E3M2"):
        raise SafetensorError(f"Dtype not understood: {code}")
    tdtype = getattr(torch, _ATTR[code])  # AttributeError where this torch lacks the dtype
    if code in _TORCH_NATIVE:
        return torch.from_dlpack(t)
    raw = torch.from_dlpack(t.to_dlpack(raw=True))
    shape = list(t.shape)
    if code == "F4":
        if not shape or shape[-1] % 2:
            raise SafetensorError(f"f4_x2 dtype requires that the last dim be divisible by 2 "
                                  f"in torch: got {shape}")
        shape[-1] //= 2
    return raw.view(tdtype).reshape(shape)


def _convert(h, x):
    """A numpy array for the frameworks that take one, as safetensors converts."""
    fw = h._framework
    if fw == "flax":
        import jax.numpy as jnp

        return jnp.array(x)
    if fw == "tensorflow":
        import tensorflow

        return tensorflow.convert_to_tensor(x)
    if fw == "mlx":
        import mlx.core

        return mlx.core.array(x)
    if fw == "paddle":
        import paddle

        place = h._shown.replace("cuda", "gpu") if h._device is not None else "cpu"
        return paddle.to_tensor(x, place=place)
    return x


def _make(h, t):
    code = _st_dtype(t)
    if h._framework == "pytorch":
        x = _torch_of(t, code)
        return x if h._device is None else x.to(h._device)
    return _convert(h, _numpy_of(t, code))


def _is_int(x):
    import operator

    if isinstance(x, slice):
        return False
    try:
        operator.index(x)
        return True
    except TypeError:
        return False


class _SafeSlice:
    """get_slice()'s object. Indexing is safetensors': torch's own indexing for PyTorch over a
    mapping (a view), and for numpy and backend="pread" its native rules: ints and slices only,
    steps ignored, no clamping, a copy."""

    def __init__(self, h, t):
        self._h = h
        self._t = t  # keeps the model (its mapping) alive after the handle closes
        self._code = _st_dtype(t)

    def get_shape(self):
        return list(self._t.shape)

    def get_dtype(self):
        return self._code

    def __getitem__(self, index):
        h, t = self._h, self._t
        if h._framework == "pytorch" and h._backend == "mmap":
            x = _torch_of(t, self._code)[index]
            return x if h._device is None else x.to(h._device)
        key = _native_key(index, list(t.shape))
        if h._framework == "pytorch":
            x = _torch_of(t, self._code)[key].clone()
            return x if h._device is None else x.to(h._device)
        import numpy as np

        return _convert(h, np.array(_numpy_of(t, self._code)[key]))


def _extract_failure(index):
    return TypeError(f"failed to extract enum Slice ('Slice | Slices'): {type(index).__name__} "
                     f"{index!r} is neither a slice, an int nor a sequence of them")


def _native_key(index, shape):
    """safetensors' native slicing rules, as a tuple numpy or torch indexes with."""
    if isinstance(index, slice) or _is_int(index):
        items = [index]
    elif isinstance(index, (str, bytes, bytearray)) or not hasattr(index, "__len__"):
        raise _extract_failure(index)
    else:
        items = list(index)
        for x in items:
            if not (isinstance(x, slice) or _is_int(x)) or isinstance(x, (list, tuple)):
                raise _extract_failure(index)
        if isinstance(index, list):
            if items:
                raise SafetensorError("Non empty lists are not implemented")
            items = [slice(0, 0)]
    import operator

    parts = []  # (dim, start, stop, rendered, python index)
    for dim, (x, size) in enumerate(zip(items, shape)):
        if isinstance(x, slice):
            bounds = []
            for b in (x.start, x.stop):
                if b is None:
                    bounds.append(None)
                    continue
                b = operator.index(b)
                if b < 0:
                    raise OverflowError("can't convert negative int to unsigned")
                bounds.append(b)
            start, stop = bounds
            text = ("" if start is None else str(start)) + ":" + ("" if stop is None else
                                                                   str(stop))
            lo = start or 0
            hi = size if stop is None else stop
            parts.append((dim, lo, hi, text, slice(lo, hi)))
        else:
            i = operator.index(x)
            if not -(1 << 31) <= i < 1 << 31:
                raise _extract_failure(index)
            j = i + size if i < 0 else i
            if j < 0:
                raise SafetensorError(f"Invalid index {i} for dimension {dim} of size {size}")
            parts.append((dim, j, j + 1, str(j), j))
    rendered = "[" + ", ".join(p[3] for p in parts) + "]"
    shape_text = "[" + ", ".join(str(s) for s in shape) + "]"
    for dim, lo, hi, _, _ in reversed(parts):
        size = shape[dim]
        if lo >= size or hi > size:
            asked = lo if lo >= size else hi - 1
            raise SafetensorError(f"Error during slicing {rendered} with shape {shape_text}: "
                                  f"index {asked} out of bounds for tensor dimension #{dim} of "
                                  f"size {size}")
        if lo > hi:
            raise SafetensorError(f"Error during slicing {rendered} with shape {shape_text}: "
                                  f"start {lo} is after stop {hi} in tensor dimension #{dim}")
    return tuple(p[4] for p in parts)
