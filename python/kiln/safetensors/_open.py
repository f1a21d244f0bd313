# SPDX-License-Identifier: MIT
"""safe_open and _safe_open_handle of kiln.safetensors: safetensors' reading API over a kiln
model of one file (kiln.open(one_file=True)), with safetensors' argument rules, errors and
slicing semantics. The same class is kiln's own reading API: kiln.safe_open opens it with
kiln's options (the whole series, alignment for PyTorch only, api="kiln")."""

import errno as _errno
import json as _json

from .. import _dtypes, _kiln
from .._kiln import Error as _KilnError
from .._kiln import FileError as _KilnFileError
from .._kiln import open as _kiln_open
from . import SafetensorError, _debug_str, _not_instance, _path, _st_dtype

_FRAMEWORKS = {"pt": "pytorch", "torch": "pytorch", "pytorch": "pytorch", "np": "numpy",
               "numpy": "numpy", "tf": "tensorflow", "tensorflow": "tensorflow",
               "jax": "flax", "flax": "flax", "mlx": "mlx", "paddle": "paddle"}
# backend= names and the kiln source behind each (docs/python.md).
_BACKENDS = {"mmap": "mmap", "pread": "read"}
_INDEXED = ("cuda", "musa", "npu", "xpu", "xla", "mlu", "hpu")

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
    """What safe_open and _safe_open_handle share: one implementation of safetensors' reading
    API, and of kiln's (api="kiln", which kiln.safe_open gives)."""

    def _start(self, filename, framework, device, backend, *, one_file=True, align=True,
               api="safetensors", timeout=0, verify=False):
        if api == "safetensors":
            fw, shown, torch_device = _safetensors_arguments(framework, device, backend)
        elif api == "kiln":
            fw, shown, torch_device = _kiln_arguments(framework, device, backend)
        else:
            raise ValueError(f"api must be 'safetensors' or 'kiln', not {api!r}")
        # Any format; one file (a shard of a series alone) unless one_file=False. Aligned copies
        # of the few tensors misaligned for their dtype (align=None: for PyTorch only, which
        # needs them; numpy reads misaligned data), the rest zero-copy.
        # For another device every view is copied there at once and never handed out: the
        # file is mapped read-only shared, so no page is copied on write or pinned writable.
        options = {"source": _BACKENDS[backend], "one_file": one_file,
                   "align": fw == "pytorch" if align is None else align, "timeout": timeout,
                   "copy_on_write": shown == "cpu", "verify": bool(verify)}
        if api == "kiln":
            d = _kiln_open(filename, **options)  # kiln's errors, as they are
        else:
            try:
                d = _kiln_open(filename, **options)
            except _KilnFileError as e:
                # A missing file as safetensors says it; any other failure (a refused
                # connection, a TLS error, HTTP 403) as what it is, with kiln's message.
                if e.errno == _errno.ENOENT:
                    raise FileNotFoundError(
                        f"No such file or directory: {_kiln.shown(filename)}") from None
                raise OSError(e.errno, e.strerror or str(e)) from None
            except _KilnError as e:
                # verify= is kiln's own: a byte that differs from its digest, or no digests,
                # is kiln's error (CorruptError, NOTFOUND), not a header safetensors refused.
                if verify and not isinstance(e, _kiln.FormatError):
                    raise
                raise SafetensorError(f"Error while deserializing header: {e}") from None
        if shown != "cpu" and fw not in ("pytorch", "paddle"):
            d.close()
            raise SafetensorError(f"Device {shown} is not supported for framework {fw}")
        self._dir = d
        self._kiln = api == "kiln"
        self._framework = fw
        self._backend = backend
        self._device = None if shown == "cpu" else torch_device
        self._shown = shown
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
            if self._kiln:
                raise ValueError("the directory is closed")  # as a closed kiln.Model says
            raise SafetensorError("File is closed")
        return self._dir

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.close()

    def close(self):
        """Drop the handle's hold on the model: the tensors handed out keep their mapping (or
        block) until they are gone."""
        if self._dir is not None:
            self._dir.close()
            self._dir = None

    def _views(self):
        return [t for t in self._live() if t.name is not None and t.role == "model"]

    def keys(self):
        """The names of the tensors, sorted (without kiln's metadata tensor)."""
        return sorted(t.name for t in self._views())

    def offset_keys(self):
        """The names of the tensors in the order of their bytes in the file."""
        return [t.name for t in sorted(self._views(), key=lambda t: (t.file_offset, t.name))]

    def metadata(self):
        """The file's __metadata__ (str -> str), or None when it has none. A GGUF file's
        (or a KLNT document's) typed values are given as JSON text.

        api="kiln": what the model says besides its tensors, {} when nothing: safetensors'
        __metadata__, a GGUF file's key/values typed (int, float, bool, str, list), or what a
        KLNT file's kiln.metadata document kept of either (kiln.Model.metadata())."""
        d = self._live()
        meta = d.metadata()
        if self._kiln:
            return meta
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
        if self._kiln:
            return self._live()[name]  # KeyError for no such tensor, as a kiln.Model gives
        if not isinstance(name, str):
            raise _not_instance("name", name, "str")
        d = self._live()
        try:
            t = d[name]
        except KeyError:
            t = None
        if t is None or t.role != "model":
            raise SafetensorError(f"File does not contain tensor {name}")
        return t

    def _make(self, t):
        if self._kiln:
            return t.numpy() if self._framework == "numpy" else _kiln_torch_of(t)
        code = _st_dtype(t)
        if self._framework == "pytorch":
            x = _torch_of(t, code)
            return x if self._device is None else x.to(self._device)
        return _convert(self, _numpy_of(t, code))

    def get_tensor(self, name):
        """The whole tensor: a zero-copy view of the file's private mapping (or of the block
        read at open with backend="pread"). api="kiln": numpy arrays are read-only."""
        return self._make(self._view(name))

    def get_tensors(self):
        """Every tensor, by name, in the order of their bytes in the file."""
        return {t.name: self._make(t)
                for t in sorted(self._views(), key=lambda t: (t.file_offset, t.name))}

    def get_slice(self, name):
        """A slice object: ``get_shape()``, ``get_dtype()``, and ``[...]`` for part of it."""
        t = self._view(name)
        return _KilnSlice(t, self._framework) if self._kiln else _SafeSlice(self, t)


def _safetensors_arguments(framework, device, backend):
    """safetensors' checks of framework, device and backend, with its errors: (framework,
    device shown, device for torch)."""
    if not isinstance(framework, str):
        raise _not_instance("framework", framework, "str")
    fw = _FRAMEWORKS.get(framework)
    if fw is None:
        raise SafetensorError(f"framework {framework} is invalid")
    shown, torch_device = _device(device)
    if not isinstance(backend, str):
        raise _not_instance("backend", backend, "str")
    if backend not in _BACKENDS:
        raise SafetensorError(f"backend {_debug_str(backend)} is invalid (expected one "
                              f'of: "mmap", "pread")')
    return fw, shown, torch_device


def _kiln_arguments(framework, device, backend):
    """kiln.safe_open's checks, with ValueError: numpy or PyTorch, on the CPU."""
    fw = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if fw not in ("numpy", "pytorch"):
        raise ValueError(f"framework must be 'np' or 'pt', not {framework!r}")
    if str(device) != "cpu":
        raise ValueError(f"device {device!r}: only 'cpu' is supported")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"backend must be 'mmap' or 'pread', not {backend!r}")
    return fw, "cpu", "cpu"


class safe_open(_Open):  # noqa: N801 (safetensors' name)
    """``safe_open(filename, framework, device="cpu", *, backend="mmap")``, as in safetensors:
    the tensors of one file, on demand. ``framework``: "pt"/"torch"/"pytorch", "np"/"numpy"
    (and "tf", "flax", "mlx", "paddle" when installed); ``backend``: "mmap" (kiln's mmap
    source) or "pread" (kiln's read source). Any format kiln reads opens: safetensors, KLNT,
    GGUF.

    kiln's options, keyword-only (kiln.safe_open passes them): ``one_file=False`` opens the
    whole series or sharded checkpoint of which ``filename`` is any shard (or the index);
    ``align``: True copies the tensors misaligned for their dtype into aligned memory at open,
    None only for PyTorch, False never; ``timeout``: for a URL, the seconds each operation (the
    open, each read) may take, retries included (0: no bound past the per-request limits of
    docs/remote.md); ``api="kiln"`` gives kiln's contract instead of
    safetensors': kiln's errors (kiln.Error at open, KeyError for a missing name, ValueError for
    an argument or a closed handle), numpy arrays read-only, dtypes and get_slice().get_dtype()
    by kiln's names ("f32"), get_slice() indexing as numpy and torch index (steps, negative
    ones too; a copy for torch), metadata() as kiln.Model.metadata(), numpy and PyTorch on the
    CPU only. ``verify=True``: every byte checked against the file's digests as it is read at
    open (a sidecar from ``klnt digest``, a model_signing statement or a Hugging Face cache
    blob name; docs/integrity.md), kiln.CorruptError naming the chunk that differs, kiln.Error
    (NOTFOUND) where there are no digests.
    """

    def __init__(self, filename, framework, device="cpu", *, backend="mmap", one_file=True,
                 align=True, api="safetensors", timeout=0, verify=False):
        self._dir = None
        if api != "kiln":  # kiln takes any path kiln.open takes (bytes too)
            filename = _path("filename", filename)
        self._start(filename, framework, device, backend, one_file=one_file, align=align,
                    api=api, timeout=timeout, verify=verify)


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

    row = _dtypes.SAFETENSORS[code]
    if row.numpy_native:
        return t.numpy(writable=True)
    if row.name is None:
        raise SafetensorError(f"Dtype not understood: {code}")
    if code == "BF16":
        dtype = np.dtype("bfloat16")  # numpy's own TypeError without ml_dtypes, as upstream
    else:
        dtype = getattr(np, row.name)
    return t.numpy(raw=True, writable=True).view(dtype).reshape(t.shape)


def _torch_of(t, code):
    import torch

    row = _dtypes.SAFETENSORS[code]
    if row.name is None:
        raise SafetensorError(f"Dtype not understood: {code}")
    tdtype = getattr(torch, row.name)  # AttributeError where this torch lacks the dtype
    if row.torch_dlpack:
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


def _kiln_torch_dtype(t):
    """The torch dtype of a kiln view, by kiln's dtype name; TypeError where torch has none."""
    import torch

    row = _dtypes.KILN.get(t.dtype)
    tdtype = row.torch_dtype() if row else None
    if tdtype is None:
        raise TypeError(f"tensor {t.index} ({t.name!r}) has dtype {t.dtype}, which PyTorch "
                        f"{torch.__version__} has no type for; numpy(raw=True) or "
                        f"to_dlpack(raw=True) give its bytes as uint8")
    return tdtype


def _kiln_torch_of(t):
    """api="kiln": a torch tensor viewing the payload (zero copy, through DLPack)."""
    import torch

    row = _dtypes.KILN.get(t.dtype)
    if row is not None and row.torch_dlpack:
        return torch.from_dlpack(t)
    # The bytes as uint8, reinterpreted: works in every torch version, with no DLPack code for
    # the dtype needed.
    tdtype = _kiln_torch_dtype(t)
    return torch.from_dlpack(t.to_dlpack(raw=True)).view(tdtype).reshape(t.shape)


class _KilnSlice:
    """get_slice()'s object under api="kiln": numpy's indexing, steps and negative ones too;
    ``s[a:b, ::2]`` reads only the pages the slice touches (mmap). A copy for PyTorch, which has
    no negative steps to view."""

    def __init__(self, tensor, framework):
        self._t = tensor  # keeps the model (its mapping) alive after the handle closes
        self._framework = framework

    def get_shape(self):
        return list(self._t.shape)

    def get_dtype(self):
        return self._t.dtype

    def __getitem__(self, key):
        t = self._t
        if self._framework == "numpy":
            return t.numpy()[key]
        import numpy as np
        import torch

        row = _dtypes.KILN.get(t.dtype)
        if row is not None and row.numpy_native:
            return torch.from_numpy(np.array(t.numpy()[key]))
        tdtype = _kiln_torch_dtype(t)
        raw = t.numpy(raw=True).view(row.same_width()).reshape(t.shape)[key]
        return torch.from_numpy(np.array(raw)).view(tdtype)


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
