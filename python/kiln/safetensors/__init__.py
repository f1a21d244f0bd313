# SPDX-License-Identifier: MIT
"""kiln.safetensors: the API of Hugging Face's ``safetensors`` package over kiln's reader and
writer, so that ``sys.modules["safetensors"] = kiln.safetensors`` (or importing from here)
replaces it.

The names, signatures, defaults, exceptions and messages are safetensors' own (its 0.8 API):
``safe_open``, ``_safe_open_handle``, ``serialize``, ``serialize_file``, ``deserialize``,
``TensorSpec``, ``SafetensorError``; ``kiln.safetensors.numpy`` and ``kiln.safetensors.torch``
hold the framework functions (``load_file``, ``save_file``, ``save_model``, ...). Files written
here are byte for byte the files safetensors writes for the same tensors (the layout rules are in
docs/formats.md, "Writing safetensors").

What kiln does differently, on purpose (docs/python.md has the list):

- reading goes through kiln's validator (the reference's rules and what it leaves loose, such as
  duplicate keys); a rejected header raises ``SafetensorError("Error while deserializing header:
  ...")`` with kiln's message (class, tensor, byte offset) after safetensors' prefix;
- ``safe_open`` also opens KLNT and GGUF files (one file; a shard of a series alone);
- tensors are zero-copy views of a private (copy-on-write) mapping for numpy as for PyTorch:
  writes change this process's pages, never the file, and are seen by other tensors taken from
  the same handle; safetensors copies numpy tensors out instead;
- ``backend="mmap"`` is kiln's mmap source, ``backend="pread"`` kiln's read source (the payload
  read into memory of the handle's own at open, with pread, front to back);
- ``serialize_file`` fsyncs the new file and its directory before returning, and a replaced file
  keeps its permission bits (safetensors' are 0600 on every new file);
- at most 8 dimensions per tensor (kiln's views have 8 slots).
"""

import operator as _operator
import os as _os

from .. import _dtypes
from .._kiln import Error as _KilnError
from .._kiln import FileError as _KilnFileError
from .._kiln import parse as _parse
from .._kiln import write_safetensors as _write_safetensors

__version__ = "0.8.0"  # the safetensors API this module matches; kiln's own is kiln.__version__

__all__ = ["SafetensorError", "TensorSpec", "deserialize", "safe_open", "serialize",
           "serialize_file"]


class SafetensorError(Exception):
    """Custom Python Exception for Safetensor errors."""


_MAX_RANK = 8


def _qual(x):
    return type(x).__qualname__


def _not_instance(arg, x, target):
    what = "'None'" if x is None else f"'{_qual(x)}' object"
    prefix = f"argument '{arg}': " if arg else ""
    return TypeError(f"{prefix}{what} is not an instance of '{target}'")


def _debug_str(s):
    """A string as Rust's {:?} shows it (safetensors' messages quote names so)."""
    out = []
    for c in s:
        o = ord(c)
        if c in "\"\\":
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c == "\0":
            out.append("\\0")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{{{o:x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _unsigned(arg, v):
    try:
        n = _operator.index(v)
    except TypeError:
        raise TypeError(f"argument '{arg}': '{_qual(v)}' object cannot be interpreted as an "
                        f"integer") from None
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return n


class TensorSpec:
    """One tensor for ``serialize``/``serialize_file``: ``TensorSpec(*, dtype, shape, data_ptr,
    data_len)``. ``dtype`` is numpy's or torch's name ("float32", "bfloat16", ...); the
    ``dtype`` property is the header's code ("F32"). For "float4_e2m1fn_x2" the given shape is
    the packed storage shape and the last dimension is doubled to the logical one.

    ``data_ptr`` is read for ``data_len`` bytes while serializing: the caller keeps the memory
    alive.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype, shape, data_ptr, data_len):
        if not isinstance(dtype, str):
            raise _not_instance("dtype", dtype, "str")
        row = _dtypes.NAMES.get(dtype)  # numpy's and torch's names, in safetensors' order
        if row is None:
            raise SafetensorError(f"Unknown dtype {_debug_str(dtype)}. Supported dtypes: "
                                  + ", ".join(_dtypes.NAMES))
        code = row.safetensors
        if isinstance(shape, str):
            raise TypeError("argument 'shape': Can't extract `str` to `Vec`")
        try:
            dims = list(shape)
        except TypeError:
            raise _not_instance("shape", shape, "Sequence") from None
        dims = [_unsigned("shape", d) for d in dims]
        if code == "F4" and dims:
            if dims[-1] * 2 >= 1 << 64:
                raise SafetensorError(f"F4 last-dim {dims[-1]} doubled to logical shape "
                                      f"overflows usize")
            dims[-1] *= 2
        object.__setattr__(self, "_dtype", code)
        object.__setattr__(self, "_shape", dims)
        object.__setattr__(self, "_data_ptr", _unsigned("data_ptr", data_ptr))
        object.__setattr__(self, "_data_len", _unsigned("data_len", data_len))

    def __setattr__(self, name, value):
        raise AttributeError(f"'TensorSpec' object attribute '{name}' is read-only")

    @property
    def dtype(self):
        """The header's dtype code ("F32", "BF16", ...)."""
        return self._dtype

    @property
    def shape(self):
        """The logical shape written in the header (a new list)."""
        return list(self._shape)

    @property
    def data_ptr(self):
        return self._data_ptr

    @property
    def data_len(self):
        return self._data_len

    def __repr__(self):
        return (f"TensorSpec(dtype='{self._dtype}', shape={self._shape!r}, "
                f"data_ptr={self._data_ptr}, data_len={self._data_len})")


def _writer_input(tensor_dict, metadata):
    if not isinstance(tensor_dict, dict):
        raise _not_instance("tensor_dict", tensor_dict, "dict")
    items = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise _not_instance("tensor_dict", name, "str")
        if not isinstance(spec, TensorSpec):
            raise _not_instance("tensor_dict", spec, "TensorSpec")
        if len(spec._shape) > _MAX_RANK:
            raise SafetensorError(f"Error while serializing: tensor {name!r} has "
                                  f"{len(spec._shape)} dimensions; kiln holds at most "
                                  f"{_MAX_RANK}")
        items.append((name, spec._dtype, spec._shape, spec._data_ptr, spec._data_len))
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _not_instance("metadata", metadata, "dict")
        for k, v in metadata.items():
            for x in (k, v):
                if not isinstance(x, str):
                    raise _not_instance("metadata", x, "str")
    return items, metadata


def _writer_error(e):
    """safetensors' text for a refusal of kiln's writer (its serialize error kinds)."""
    field = getattr(e, "field", None)
    if isinstance(e, _KilnFileError):
        errno = getattr(e, "errno", None) or 0
        return f"I/O error: {_os.strerror(errno)} (os error {errno})" if errno else str(e)
    if field == "byte_length":
        return "invalid shape, data type, or offset for tensor"
    if field == "shape" and e.cls == "TYPE":
        return ("The slice is slicing for subbytes dtypes, and the slice does not end up at a "
                "byte boundary, this is invalid.")
    if field == "shape" and e.cls == "LIMIT":
        return "overflow computing buffer size from shape and/or element type"
    if field == "header":
        return "header too large"
    return str(e)


def serialize(tensor_dict, metadata=None):
    """The safetensors file of ``tensor_dict`` (name -> TensorSpec) as bytes, with
    ``metadata`` (str -> str, or None) as its __metadata__. The GIL is released while the bytes
    are laid out and copied."""
    items, metadata = _writer_input(tensor_dict, metadata)
    try:
        return _write_safetensors(None, items, metadata)
    except _KilnError as e:
        raise SafetensorError(f"Error while serializing: {_writer_error(e)}") from None


def _path(arg, filename):
    """A path argument as safetensors takes one (str or PathLike of str); arg None: a message
    without safetensors' "argument" prefix."""
    if isinstance(filename, (bytes, bytearray)):
        raise _not_instance(arg, filename, "str")
    try:
        p = _os.fspath(filename)
    except TypeError:
        prefix = f"argument '{arg}': " if arg else ""
        raise TypeError(f"{prefix}expected str, bytes or os.PathLike object, not "
                        f"{_qual(filename)}") from None
    if not isinstance(p, str):
        raise _not_instance(arg, p, "str")
    return p


def serialize_file(tensor_dict, filename, metadata=None, *, digests=False):
    """Write the safetensors file of ``tensor_dict`` to ``filename``, replacing it atomically
    (a reader that has the old file mapped keeps its pages; no partial file is ever visible),
    synced to disk. The GIL is released while the file is written. The bytes are the ones
    safetensors writes; ``digests=True`` (kiln's own) adds the file's digest table to its
    ``__metadata__`` (``kiln.digests``, docs/integrity.md), which ``verify=True`` and ``klnt
    verify`` check and ``metadata()`` leaves out."""
    items, metadata = _writer_input(tensor_dict, metadata)
    path = _path("filename", filename)
    if not isinstance(digests, bool):
        raise TypeError(f"digests must be a bool, not {type(digests).__name__}")
    try:
        _write_safetensors(path, items, metadata, digests=digests)
    except _KilnError as e:
        raise SafetensorError(f"Error while serializing: {_writer_error(e)}") from None


def _by_offset(d):
    return sorted(d, key=lambda t: (t.file_offset, t.name))


def deserialize(bytes):  # noqa: A002 (safetensors' parameter name)
    """The tensors of a safetensors file held in ``bytes``: a list of (name, {"shape", "dtype",
    "data"}) in file order, each ``data`` a bytearray copy of the tensor's bytes. The bytes are
    validated as a file is."""
    import builtins

    if not isinstance(bytes, builtins.bytes):
        raise _not_instance("bytes", bytes, "bytes")
    try:
        d = _parse(bytes)
    except _KilnError as e:
        raise SafetensorError(f"Error while deserializing: {e}") from None
    try:
        if d.format != "safetensors":
            raise SafetensorError(f"Error while deserializing: the bytes are a {d.format} "
                                  f"file, not safetensors")
        return [(t.name, {"shape": list(t.shape), "dtype": _st_dtype(t),
                          "data": bytearray(t.numpy(raw=True))})
                for t in _by_offset(d)]
    finally:
        d.close()


def _st_dtype(t):
    """The header's code for a kiln view ("F32"; an opaque one's layout, such as "C64"): the
    library's own table (kiln_safetensors_dtype)."""
    code = t.safetensors_dtype
    if code is None:
        raise SafetensorError(f"tensor {t.name!r}: dtype {t.layout or t.dtype} has no "
                              f"safetensors dtype")
    return code


from ._open import _safe_open_handle, safe_open  # noqa: E402,F401
