# SPDX-License-Identifier: MIT
"""kiln: validated, zero-copy loading of model weights: KLNT v2, safetensors and GGUF files.

Native API: ``kiln.open(path)`` gives a ``Model`` (also known as ``kiln.Dir``) of ``Tensor``
views; ``Tensor.numpy()`` and ``Tensor.__dlpack__()`` view the payload without copying.
``path`` may be a KLNT file or any shard of a series (``STEM-NNNNN-of-MMMMM.klnt``), a
``.safetensors`` file, any shard of a sharded checkpoint or its ``model.safetensors.index.json``,
or a ``.gguf`` file or any part of a split one: every file of the model opens as one ``Model``.
``Model.format`` says which format; ``Model.metadata(types=True)`` gives GGUF key/values with
their GGUF types. ``Tensor.alignment`` is the payload's real alignment (safetensors promises
none; ``align=True`` copies misaligned tensors into aligned memory).

safetensors-style API: ``safe_open``, ``load_file`` (kiln's semantics: any format, a series
whole) and ``save_file``, which writes KLNT, not safetensors. ``kiln.safetensors`` is the
safetensors package's own API, a drop-in for it, whose ``safe_open`` is the same class as
``kiln.safe_open``'s and whose ``numpy.save_file``/``torch.save_file`` write safetensors
(docs/python.md).

Lifetime: arrays and tensors view the file's mapping (or the block read into memory with
``source="read"``/``"uring"``). Closing a ``Model`` or leaving a ``with`` block does not unmap
while any of them is alive: the model is closed when the last array, DLPack capsule,
``Tensor`` view or ``Model`` using it is gone.

Writes: numpy arrays are read-only (``writeable=False``). PyTorch has no read-only tensors, so
a tensor made by ``torch.from_dlpack`` (or ``safe_open(framework="pt")``) is writable; the file
is therefore mapped copy-on-write (``kiln.open(copy_on_write=True)``, the default), and a write
changes a private copy of the page: never the file, never another ``open`` of it, but it is
seen by the other arrays and tensors of the same ``Model``, which share the mapping (as with
safetensors). ``copy_on_write=False`` maps read-only shared: a write is then a segmentation
fault. With ``source="read"``/``"uring"`` the block is in private memory already.

Errors: ``kiln.Error`` (attributes ``code``, ``cls``, ``tensor``, ``field``, ``offset``,
``errno``) with ``FormatError`` (``FrameError``, ``FormatTypeError``, ``LimitError``,
``UTF8Error``) for rejected bytes, ``FileError`` (also an ``OSError``) for failed system
calls and ``CorruptError`` for bytes that differ from their digest (``Model.verify_digests``);
other codes (``NOMEM``, ``INVAL``, ...) are plain ``kiln.Error`` with ``cls`` set.
"""

import json as _json

import numpy as _np

from . import _dtypes
from ._kiln import (  # noqa: F401
    METADATA_TENSOR,  # the tensor of the converters' metadata document (docs/convert.md)
    CorruptError,
    DeviceView,
    Error,
    FileError,
    FormatError,
    FormatTypeError,
    FrameError,
    LimitError,
    Model,
    Tensor,
    UTF8Error,
    is_url,
    library_version,
    open,
    write_file,
)

__version__ = library_version

# The model type's first name, which README and users know.
Dir = Model


def __getattr__(name):
    # kiln.torch without importing torch at `import kiln` (it takes a second, and may be absent);
    # kiln.cuda the same way.
    if name in ("torch", "cuda"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def patch_safetensors():
    """kiln's safetensors drop-in bound in sys.modules and in already-imported transformers,
    accelerate and diffusers modules; returns a kiln Patch with undo() (docs/python.md)."""
    from ._patch import patch_safetensors as patch

    return patch()


def _sequence(keys, order, path):
    """Positions in load order: the names of ``order`` first (once each, as given), then the
    rest in file order (kiln.torch.load and kiln.cuda.load)."""
    first = []
    if order is not None:
        by_name = {k: i for i, k in enumerate(keys)}
        seen = set()
        for name in order:
            if name not in by_name:
                raise KeyError(f"order names {name!r}, which is not in {path}")
            if name not in seen:
                seen.add(name)
                first.append(by_name[name])
    taken = set(first)
    return first + [i for i in range(len(keys)) if i not in taken]

__all__ = [
    "open", "Model", "Dir", "Tensor", "safe_open", "load_file", "save_file", "write_file",
    "Error", "FormatError", "FrameError", "FormatTypeError", "LimitError", "UTF8Error",
    "FileError", "CorruptError", "patch_safetensors",
]

def _is_torch(x):
    return type(x).__module__.startswith("torch")


def safe_open(filename, framework="np", device="cpu", *, one_file=False):
    """``safe_open(path, framework="np"|"pt", device="cpu")``, safetensors' reading API with
    kiln's contract: ``kiln.safetensors.safe_open`` (the one implementation) opened with
    ``one_file=one_file, align=None, api="kiln"`` (its docstring has the other options).

    get_tensor() returns a read-only numpy array viewing the file ("np"), or a torch tensor made
    with DLPack ("pt", same memory, copy-on-write: a write changes this process's copy only).
    Arrays outlive the ``with`` block safely. ``filename`` may be any shard of a series: keys(),
    get_tensor() and get_slice() then cover every shard. keys() lists the named tensors,
    sorted, without the metadata tensor. ``one_file=True`` opens a shard of a series alone.
    Misaligned tensors get aligned copies for "pt" only (torch needs them; numpy does not).
    Errors are kiln's: kiln.Error at open, KeyError for a name not in the model, ValueError for
    an argument.
    """
    # Imported here: kiln.safetensors imports this module's names.
    from .safetensors._open import safe_open as one

    return one(filename, framework, device, one_file=one_file, align=None, api="kiln")


def load_file(filename, framework="np", *, one_file=False):
    """Every named tensor of the file (or of its whole series) in a dict (name -> array), zero
    copy. ``one_file=True`` reads a shard of a series alone."""
    with safe_open(filename, framework, one_file=one_file) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _spec(name, value):
    if _is_torch(value):
        import torch

        value = value.detach().cpu().contiguous()
        row = _dtypes.NAMES.get(str(value.dtype).split(".")[-1])
        if row is not None and row.kiln and not row.numpy and row.torch_dtype() is not None:
            # numpy has no such type (bfloat16, the float8s): the bytes, through an integer of
            # the same width, under kiln's name.
            same = getattr(torch, row.same_width().name)
            return (name, row.kiln, tuple(value.shape), value.view(same).numpy())
        value = value.numpy()
    arr = _np.asarray(value)
    if not arr.flags.c_contiguous:  # (not ascontiguousarray: it makes 0-d arrays 1-d)
        arr = _np.array(arr, order="C")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    dtype = _dtypes.KILN_OF_NUMPY.get(arr.dtype)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: dtype {arr.dtype} has no KLNT type")
    return (name, dtype, arr.shape, arr.reshape(-1).view(_np.uint8))


def _metadata_spec(metadata):
    """The metadata document of the converters' convention (docs/convert.md) as a u8 tensor:
    the str -> str dict is safetensors' __metadata__, so `klnt export --to safetensors` writes
    it back as such. The file was made by kiln, hence "source": "klnt"."""
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, not {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str; {k!r}: {v!r} is "
                            f"{type(k).__name__} to {type(v).__name__}")
    doc = {"kiln.metadata": 1, "source": "klnt", "safetensors": {"metadata": metadata}}
    # surrogatepass is not allowed: a lone surrogate is no UTF-8, and encode() says so.
    raw = _json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return (METADATA_TENSOR, "u8", (len(raw),), raw)


def save_file(tensors, filename, metadata=None, *, max_shard_size=None, one_file=False,
              digests=True):
    """Write ``tensors`` (name -> numpy array or torch tensor) as canonical KLNT, of any size.
    It writes KLNT, never safetensors: ``kiln.safetensors.numpy.save_file`` and
    ``kiln.safetensors.torch.save_file`` write safetensors files (docs/python.md, "Which
    save_file writes what").

    One file when the tensors fit (a KLNT file's name heap holds some 64 KiB of names, 1,400 to
    3,500 tensors of usual names) and no shard would pass ``max_shard_size`` (payload bytes);
    otherwise a series ``STEM-00001-of-0000N.klnt`` beside ``filename`` (STEM: ``filename``
    without ``.klnt``), which ``load_file``/``safe_open``/``kiln.open`` of any shard give back
    whole. Returns the path of the (first) file written. The output replaces an earlier one
    atomically, whatever its form (a series of another count, or the single file); a failure
    leaves the earlier one whole. A ``filename`` named like a shard is refused (readers would
    look for the rest of its series).

    ``metadata`` (a dict of str to str, as safetensors' ``__metadata__``) is kept in the
    converters' metadata document (``kiln.metadata``, the last tensor of the first file):
    ``safe_open().metadata()`` returns it and ``klnt export --to safetensors`` writes it as
    ``__metadata__``. ``None`` writes no document.

    ``one_file=True`` writes exactly ``filename`` as one file, whatever its name (a shard of a
    series written by hand, one per process say; its siblings are the caller's to write), and
    fails where the names do not fit one file.

    Each file ends with its digest table (``kiln.digests``, docs/integrity.md): ``verify=True``
    on the loads and ``klnt verify`` check every byte against it, and kiln's loads leave it out
    of the tensors. ``digests=False`` writes the tensors alone.
    """
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        if not name:
            raise ValueError("tensor names must not be empty (KLNT has no empty names)")
        if name == METADATA_TENSOR:
            raise ValueError(f"{METADATA_TENSOR!r} is reserved for the metadata document; "
                             f"pass metadata= instead")
    if max_shard_size is not None and (not isinstance(max_shard_size, int)
                                       or max_shard_size <= 0):
        raise ValueError(f"max_shard_size must be a positive number of bytes, not "
                         f"{max_shard_size!r}")
    specs = [_spec(name, value) for name, value in tensors.items()]
    if one_file:
        if max_shard_size is not None:
            raise ValueError("one_file=True writes one file: max_shard_size does not apply")
        if metadata is not None:
            specs.append(_metadata_spec(metadata))
        return write_file(filename, specs, one_file=True, digests=digests)
    doc = None if metadata is None else _metadata_spec(metadata)[3]
    return write_file(filename, specs, max_shard_size=max_shard_size or 0, metadata=doc,
                      digests=digests)
