# SPDX-License-Identifier: MIT
"""kiln.safetensors.numpy: safetensors.numpy's functions (save, save_file, load, load_file)
over kiln's writer and reader. Arrays that are not C-contiguous are written in C order (a
copy), big-endian ones byte-swapped: the file is what safetensors writes for the same values."""

import os  # noqa: F401 (safetensors.numpy exposes it)
import sys
from typing import Dict, List, Optional, Union  # noqa: F401

import numpy as np

from .. import _dtypes
from . import TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401


def _is_little_endian(tensor: np.ndarray) -> bool:
    order = tensor.dtype.byteorder
    if order == "=":
        return sys.byteorder == "little"
    if order in ("|", "<"):
        return True
    if order == ">":
        return False
    raise ValueError(f"Unexpected byte order {order}")


def _flatten(tensor_dict: Dict[str, np.ndarray], keep_alive_buffer: List) -> Dict[str, TensorSpec]:
    """TensorSpecs for the arrays; copies made on the way (C order, little-endian) go into
    keep_alive_buffer, which the caller holds while the specs are serialized."""
    specs = {}
    for name, arr in tensor_dict.items():
        if isinstance(arr, np.generic):  # a numpy scalar: a 0-d array, as safetensors takes it
            arr = np.asarray(arr)
        a = arr
        if not _is_little_endian(a):
            a = a.byteswap(inplace=False)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a).reshape(arr.shape)
        if a is not arr:
            keep_alive_buffer.append(a)
        specs[name] = TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data,
                                 data_len=a.nbytes)
    return specs


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors file of ``tensor_dict`` (name -> array) as bytes."""
    keep = []
    return bytes(serialize(_flatten(tensor_dict, keep), metadata=metadata))


def save_file(tensor_dict: Dict[str, np.ndarray], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None, *,
              digests: bool = False) -> None:
    """Write ``tensor_dict`` (name -> array) to ``filename`` as a safetensors file, one file
    as safetensors writes it. kiln's own ``kiln.save_file`` writes KLNT instead (one file or a
    series; docs/python.md, "Which save_file writes what"). ``digests=True`` (kiln's own) adds
    the file's digest table to ``__metadata__`` (serialize_file)."""
    keep = []
    serialize_file(_flatten(tensor_dict, keep), filename, metadata=metadata, digests=digests)


def load(data: bytes) -> Dict[str, np.ndarray]:
    """The arrays of a safetensors file held in ``data`` (copies)."""
    return _view2np(deserialize(data))


def load_file(filename: Union[str, os.PathLike], *, backend: str = "mmap",
              verify: bool = False) -> Dict[str, np.ndarray]:
    """The arrays of a safetensors (or KLNT, GGUF) file, in file order, viewing its mapping.
    ``verify=True`` (kiln's own): every byte checked against the file's digests (safe_open)."""
    with safe_open(filename, framework="np", backend=backend, verify=verify) as f:
        return f.get_tensors()


# Header code -> numpy type, for load(bytes): every dtype numpy has (the package's one table).
_TYPES = {r.safetensors: np.dtype(r.name).type for r in _dtypes.ROWS if r.numpy}


def _getdtype(dtype_str: str) -> np.dtype:
    return _TYPES[dtype_str]


def _view2np(safeview) -> Dict[str, np.ndarray]:
    out = {}
    for name, v in safeview:
        out[name] = np.frombuffer(v["data"], dtype=_getdtype(v["dtype"])).reshape(v["shape"])
    return out
