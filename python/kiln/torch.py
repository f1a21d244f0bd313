# SPDX-License-Identifier: MIT
"""kiln.torch: a checkpoint into PyTorch tensors through kiln's load pipeline (kiln_load).

``kiln.torch.load(path, device="cpu", ...)`` opens any model kiln opens (KLNT, safetensors,
GGUF; one file, a series, an index, a URL) and reads every tensor into memory the returned
tensors own, on several reader threads with the GIL released, in the order asked for
(docs/pipeline.md). ``import kiln`` makes ``kiln.torch`` available; torch itself is imported only
when it is used.
"""

import fnmatch
import mmap as _mmap
import warnings as _warnings

import numpy as _np
import torch
import torch.utils.dlpack

from . import _TORCH_ONLY, _kiln

__all__ = ["load"]

# kiln's dtype names that numpy has, as torch dtypes (through numpy, so every torch agrees).
_NATIVE = {
    "bool": torch.bool, "u8": torch.uint8, "i8": torch.int8, "i16": torch.int16,
    "i32": torch.int32, "i64": torch.int64, "f16": torch.float16, "f32": torch.float32,
    "f64": torch.float64,
}
for _k, _v in (("u16", "uint16"), ("u32", "uint32"), ("u64", "uint64")):
    if hasattr(torch, _v):
        _NATIVE[_k] = getattr(torch, _v)


def _dtype(t):
    """The torch dtype of a kiln Tensor, or None when torch has none (its bytes come as uint8)."""
    if t.dtype in _NATIVE:
        return _NATIVE[t.dtype]
    return getattr(torch, _TORCH_ONLY.get(t.dtype, ""), None)


_HUGE = 4 << 20


def _host_buffer(n, pin):
    """n bytes of host memory a tensor owns. Large ones are a private mapping advised
    MADV_HUGEPAGE, as kiln's own blocks: fresh 4 KiB pages cost more to fault in than the read."""
    if pin or n < _HUGE:
        return torch.empty(n, dtype=torch.uint8, pin_memory=pin)
    m = _mmap.mmap(-1, n, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
    try:
        m.madvise(_mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass  # a hint
    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")  # frombuffer's note on shared memory
        return torch.frombuffer(m, dtype=torch.uint8)  # keeps a reference to m


def _placement(device):
    """A function from tensor name to a torch.device."""
    if isinstance(device, dict):
        rules = [(str(p), torch.device(d)) for p, d in device.items()]
        if not rules:
            raise ValueError("device={} maps no tensor anywhere")

        def place(name):
            for pattern, dev in rules:
                if name is not None and fnmatch.fnmatchcase(name, pattern):
                    return dev
            raise ValueError(f"tensor {name!r} matches no pattern of device=")
        return place, {d for _, d in rules}
    dev = torch.device(device)
    return (lambda name: dev), {dev}


def load(path, device="cpu", *, threads=None, order=None, progress=None, group=None, tp=None):
    """Every tensor of the model at ``path`` as a dict name -> torch.Tensor, in file order.

    ``device``: "cpu", "cuda:N", or {fnmatch pattern: device} (the first pattern that matches a
    name wins; a name no pattern matches is a ValueError). The tensors own their memory (no
    mapping of the file is kept). ``threads``: reader threads (None: kiln's default, one per
    online CPU up to 16). ``order``: names to read and have ready first, in that order (layers,
    say); the rest follow in file order. ``progress(done, total)``: called with payload bytes
    about every 50 ms and at the end; an exception in it stops the load and is raised.
    Unnamed tensors (KLNT files may have them) are keyed by their index. Tensors of a dtype torch
    lacks (GGUF's quantized blocks, 4-bit types) come as their raw bytes, uint8 of shape
    (nbytes,). For a CUDA device the bytes land in pinned host memory and each tensor is copied
    to its GPU as soon as it is ready (non-blocking), so the copies overlap the reads.

    ``group`` and ``tp`` (reading each byte once per group of ranks, tensor-parallel shares) are
    not built yet: passing either raises NotImplementedError.
    """
    if group is not None or tp is not None:
        raise NotImplementedError("kiln.torch.load: group= and tp= (read-once loading over "
                                  "torch.distributed) are not built yet")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 16):
        raise ValueError(f"threads must be 1 to 16, not {threads!r}")
    place, devices = _placement(device)
    for dev in devices:
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {dev}: this PyTorch ({torch.__version__}) has no CUDA "
                               f"device (torch.cuda.is_available() is False)")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device {dev}: kiln.torch.load places tensors on cpu or cuda")

    with _kiln.open(path) as d:
        views = [d[i] for i in range(len(d))]
        keys = [t.name if t.name is not None else i for i, t in enumerate(views)]
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
        rest = set(first)
        sequence = first + [i for i in range(len(views)) if i not in rest]

        def shaped(t, buf):
            dt = _dtype(t)
            return buf if dt is None else buf.view(dt).reshape(t.shape)

        final = {}
        targets = {i: place(views[i].name if views[i].name is not None else str(i))
                   for i in sequence}
        if all(dev.type == "cpu" for dev in targets.values()):
            # kiln's own block (huge pages where the kernel gives them: fresh 4 KiB pages
            # cost more to fault in than the read), one DLPack capsule per tensor: each
            # tensor has a storage of its own, the block freed when the last one is gone.
            r = d.load([views[i] for i in sequence], threads=threads or 0, progress=progress,
                       arena=True)
            for i, cap in zip(sequence, r["capsules"]):
                final[i] = shaped(views[i], torch.utils.dlpack.from_dlpack(cap))
        else:
            raw, pairs = {}, []
            for i in sequence:
                t = views[i]
                buf = _host_buffer(t.nbytes, targets[i].type == "cuda")
                raw[i] = buf
                pairs.append((t, buf.numpy() if t.nbytes else _np.empty(0, _np.uint8)))
            position = {id(views[i]): i for i in sequence}

            def on_ready(key):
                # Each tensor to its GPU as soon as it is in pinned memory: copies overlap
                # the reads of the next ones.
                i = position[id(key)]
                out = shaped(views[i], raw[i])
                final[i] = out.to(targets[i], non_blocking=True) if targets[i].type == "cuda" else out

            d.load(pairs, threads=threads or 0, progress=progress, on_ready=on_ready)
    if any(dev.type == "cuda" for dev in targets.values()):
        torch.cuda.synchronize()
    return {keys[i]: final[i] for i in range(len(views))}
