# SPDX-License-Identifier: MIT
"""kiln.safetensors.torch: safetensors.torch's functions over kiln's writer and reader:
save/save_file (refusing shared, sparse and non-contiguous tensors as safetensors does),
load/load_file, save_model/load_model (tied weights kept once, named in the metadata), and the
storage helpers downstream code imports (storage_ptr, storage_size, _find_shared_tensors,
_remove_duplicate_names, _is_complete, _end_ptr)."""

import os  # noqa: F401 (safetensors.torch exposes it)
import sys
from collections import defaultdict
from typing import Any, Dict, List, Optional, Set, Tuple, Union  # noqa: F401

import torch

from .. import _dtypes
from . import TensorSpec, deserialize, safe_open, serialize, serialize_file  # noqa: F401
from ._open import _device


def _itemsize(dtype):
    """Bytes per element as this torch says (dtype.itemsize came in 2.1)."""
    return getattr(dtype, "itemsize", None) or torch.empty((), dtype=dtype).element_size()


# From the package's one table: bytes per element of every dtype this torch has that can be
# saved (float4_e2m1fn_x2: one byte, two values), and header code -> torch dtype for
# load(bytes), for the codes whose elements are torch's (not F4: its shape counts 4-bit values).
_SIZE = {dtype: _itemsize(dtype) for dtype in _dtypes.torch_dtypes()}
_TYPES = {r.safetensors: r.torch_dtype() for r in _dtypes.ROWS
          if r.safetensors and r.torch_dtype() is not None}


def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the tensor's storage (0 where it has none, as a meta tensor)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 (torch before 2.0 has no untyped_storage)
        try:
            return tensor.storage().data_ptr()
        except NotImplementedError:
            return 0


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the tensor's last byte."""
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + _SIZE[tensor.dtype]
    return tensor.data_ptr()


def storage_size(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's storage."""
    try:
        return tensor.untyped_storage().nbytes()
    except AttributeError:
        try:
            return tensor.storage().size() * _SIZE[tensor.dtype]
        except NotImplementedError:
            return tensor.nelement() * _SIZE[tensor.dtype]


def _filter_shared_not_shared(tensors: List[Set[str]], state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Split groups of one storage into the names whose bytes really overlap."""
    out = []
    for group in tensors:
        if len(group) < 2:
            out.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        _, last_stop, first = spans[0]
        out.append({first})
        for start, stop, name in spans[1:]:
            if start >= last_stop:
                out.append({name})
            else:
                out[-1].add(name)
            last_stop = stop
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Groups of names whose tensors share memory (each name once; tensors without storage,
    such as meta tensors, are left out)."""
    groups = {}
    for name, t in state_dict.items():
        if t.device == torch.device("meta"):
            continue
        ptr, size = storage_ptr(t), storage_size(t)
        if ptr and size:
            groups.setdefault((t.device, ptr, size), set()).add(name)
    return _filter_shared_not_shared(list(groups.values()), state_dict)


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether the tensor covers its whole storage."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.nelement() * _SIZE[tensor.dtype] == storage_size(tensor))


def _remove_duplicate_names(state_dict: Dict[str, torch.Tensor], *,
                            preferred_names: Optional[List[str]] = None,
                            discard_names: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """For each group of shared tensors, the name kept (one covering the whole storage:
    preferred names first, then names not to discard, then the first by name) -> the names
    dropped."""
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    result = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {n for n in group if _is_complete(state_dict[n])}
        if not complete:
            raise RuntimeError(
                f"Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {group}. None is covering the entire "
                f"storage.Refusing to save/load the model since you could be storing much more "
                f"memory than needed. Please refer to "
                f"https://huggingface.co/docs/safetensors/torch_shared_tensors for more "
                f"information. Or open an issue.")
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(group):
            if name != keep:
                result[keep].append(name)
    return result


def _evaluate_tensors_for_save(tensors: Dict[str, torch.Tensor]) -> None:
    """safetensors' refusals, in its order: not a dict, a value that is no tensor, sparse
    tensors, tensors sharing memory."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not "
            f"support. You can make it a dense tensor before saving with `.to_dense()` but be "
            f"aware this might make a much larger file than needed.")
    shared = [g for g in _find_shared_tensors(tensors) if len(g) > 1]
    if shared:
        raise RuntimeError(
            f"""
            Some tensors share memory, this will lead to duplicate memory on disk and potential differences when loading them again: {shared}.
            A potential way to correctly save your model is to use `save_model`.
            More information at https://huggingface.co/docs/safetensors/torch_shared_tensors
            """)


def _to_ndarray(tensor: torch.Tensor):
    """A uint8 numpy view of the tensor's bytes (on the CPU) and what keeps it alive."""
    import numpy as np

    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    count = 1
    for d in tensor.shape:
        count *= d
    total = count * _SIZE[tensor.dtype]
    if tensor.data_ptr() == 0:
        return np.empty(0), 0
    if total == 0:
        return np.empty(0, dtype=np.uint8), tensor
    import ctypes

    arr = np.ctypeslib.as_array((ctypes.c_uint8 * total).from_address(tensor.data_ptr()))
    if sys.byteorder == "big":
        size = _SIZE[tensor.dtype]
        # complex64 is two float32s, each swapped alone.
        width = _dtypes.int_of_width(size // 2 if tensor.dtype == torch.complex64 else size)
        arr = arr.view(width).byteswap(inplace=False).view(np.uint8)
    return arr, tensor


def _flatten_as_ptr(tensors: Dict[str, torch.Tensor], keep_alive: List) -> Dict[str, TensorSpec]:
    _evaluate_tensors_for_save(tensors)
    specs = {}
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. "
                f"It either means you are trying to save tensors which are reference of each "
                f"other in which case it's recommended to save only the full tensors, and "
                f"reslice at load time, or simply call `.contiguous()` on your tensor to pack "
                f"it before saving.")
        arr, ref = _to_ndarray(v)
        keep_alive.append((arr, ref))
        specs[k] = TensorSpec(dtype=str(v.dtype).split(".")[-1], shape=v.shape,
                              data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    return specs


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors file of ``tensors`` as bytes."""
    keep = []
    return bytes(serialize(_flatten_as_ptr(tensors, keep), metadata=metadata))


def save_file(tensors: Dict[str, torch.Tensor], filename: Union[str, os.PathLike],
              metadata: Optional[Dict[str, str]] = None, *,
              digests: bool = False) -> None:
    """Write ``tensors`` to ``filename`` as a safetensors file (atomic replace, synced), one
    file as safetensors writes it. kiln's own ``kiln.save_file`` writes KLNT instead (one file
    or a series; docs/python.md, "Which save_file writes what"). ``digests=True`` (kiln's own)
    adds the file's digest table to ``__metadata__`` (serialize_file)."""
    keep = []
    serialize_file(_flatten_as_ptr(tensors, keep), filename, metadata=metadata,
                   digests=digests)


def load_file(filename: Union[str, os.PathLike], device: Union[str, int] = "cpu", *,
              backend: str = "mmap", verify: bool = False) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors (or KLNT, GGUF) file, in file order: zero-copy views of a
    private mapping on the CPU. A CUDA device ("cuda", "cuda:N", N) goes through kiln.torch.load
    where torch has CUDA: reader threads into pinned memory or the GPU's own, each tensor on its
    GPU as soon as it is read. Other devices (mps, xpu, ...) are safe_open's, moved with .to().
    ``verify=True`` (kiln's own): every byte checked against the file's digests (safe_open)."""
    _, target = _device(device)  # safetensors' rules: an int N is cuda:N
    target = f"cuda:{target}" if isinstance(target, int) else target
    if target.startswith("cuda:") and torch.cuda.is_available():
        from .. import torch as _kiln_torch

        return _kiln_torch.load(os.fspath(filename), device=target, verify=verify)
    with safe_open(filename, framework="pt", device=device, backend=backend,
                   verify=verify) as f:
        return f.get_tensors()


def _getdtype(dtype_str: str) -> Optional[torch.dtype]:
    return _TYPES[dtype_str]


def _view2torch(safeview) -> Dict[str, torch.Tensor]:
    out = {}
    for name, v in safeview:
        dtype = _getdtype(v["dtype"])
        if len(v["data"]) == 0:
            assert any(d == 0 for d in v["shape"])
            t = torch.empty(v["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(v["data"], dtype=dtype).reshape(v["shape"])
        if sys.byteorder == "big":
            t = torch.from_numpy(t.numpy().byteswap(inplace=False))
        out[name] = t
    return out


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in ``data`` (copies)."""
    return _view2torch(deserialize(data))


def save_model(model: torch.nn.Module, filename: str, metadata: Optional[Dict[str, str]] = None,
               force_contiguous: bool = True):
    """Save ``model``'s state dict with each group of tied tensors stored once; the metadata
    names the kept tensor for each dropped one, which load_model reads back."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            if metadata is None:
                metadata = {}
            if name not in metadata:
                metadata[name] = kept
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), read the docs for "
                         f"potential caveats.")


def load_model(model: torch.nn.Module, filename: Union[str, os.PathLike], strict: bool = True,
               device: Union[str, int] = "cpu", *, backend: str = "mmap") -> Tuple[List[str], List[str]]:
    """Load a file saved by save_model into ``model``: (missing, unexpected) keys; with
    ``strict`` a RuntimeError names them."""
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        text = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            keys = ", ".join(f'"{k}"' for k in sorted(missing))
            text += f"\n    Missing key(s) in state_dict: {keys}"
        if unexpected:
            keys = ", ".join(f'"{k}"' for k in sorted(unexpected))
            text += f"\n    Unexpected key(s) in state_dict: {keys}"
        raise RuntimeError(text)
    return missing, unexpected
