# SPDX-License-Identifier: MIT
"""kiln.torch: a checkpoint into PyTorch tensors through kiln's load pipeline (kiln_load).

``kiln.torch.load(path, device="cpu", ...)`` opens any model kiln opens (KLNT, safetensors,
GGUF; one file, a series, an index, a URL) and reads every tensor into memory the returned
tensors own, on several reader threads with the GIL released, in the order asked for
(docs/pipeline.md). ``import kiln`` makes ``kiln.torch`` available; torch itself is imported only
when it is used.
"""

import fnmatch
import os as _os
import mmap as _mmap
import warnings as _warnings

import numpy as _np
import torch
import torch.utils.dlpack

from . import _dtypes, _kiln, _sequence
from . import cuda as _cuda

__all__ = ["load"]


def _dtype(t):
    """The torch dtype of a kiln Tensor, or None when torch has none (its bytes come as uint8)."""
    row = _dtypes.KILN.get(t.dtype)
    return row.torch_dtype() if row else None


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


def _shaped(t, buf):
    """A uint8 buffer of kiln Tensor t's bytes as a tensor of t's dtype and shape (the bytes
    themselves where torch has no such dtype)."""
    dt = _dtype(t)
    return buf if dt is None else buf.view(dt).reshape(t.shape)


def _split_bounds(n, world, rank):
    """[start, stop) of rank's part of n, as torch.tensor_split(x, world) cuts it: the first
    n % world parts one longer."""
    q, rem = divmod(n, world)
    start = rank * q + min(rank, rem)
    return start, start + q + (1 if rank < rem else 0)


def _share(t, axis, world, rank):
    """Rank's share of kiln Tensor t along axis: (axis, start, stop, shape, nbytes)."""
    if _dtype(t) is None or t.count == 0 and t.nbytes:
        raise ValueError(f"tp: tensor {t.name!r} has dtype {t.dtype}, which cannot be split "
                         f"into shares")
    if not -len(t.shape) <= axis < len(t.shape):
        raise ValueError(f"tp: tensor {t.name!r} has {len(t.shape)} axes: there is no axis "
                         f"{axis}")
    axis %= len(t.shape)
    start, stop = _split_bounds(t.shape[axis], world, rank)
    shape = tuple(t.shape[:axis]) + (stop - start,) + tuple(t.shape[axis + 1:])
    item = t.nbytes // t.count if t.count else 0
    n = item
    for d in shape:
        n *= d
    return axis, start, stop, shape, n


def _group_load(d, views, sequence, group, tp, stats):
    """Read once per group: tensors matching no tp pattern through kiln_group_load (each byte read
    by one rank, the rest all-gathered), tp shares read by each rank for itself."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    rules = list((tp or {}).items())

    def axis_of(name):
        for pattern, axis in rules:
            if name is not None and fnmatch.fnmatchcase(name, pattern):
                return int(axis)
        return None

    final, pairs, raw, shares, slices = {}, [], {}, [], []
    for i in sequence:
        t = views[i]
        axis = axis_of(t.name)
        if axis is not None:
            # Only this rank's share, read with kiln's slice reads (from any source, all in
            # one queue): no other rank needs these bytes.
            axis, start, stop, shape, n = _share(t, axis, world, rank)
            buf = _host_buffer(n, False)
            shares.append((i, shape, buf))
            slices.append((t, axis, start, stop, buf.numpy()))
            continue
        raw[i] = _host_buffer(t.nbytes, False)
        pairs.append((t, raw[i].numpy()))

    calls = [0]

    def all_gather(mine, all_):
        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore")  # frombuffer of a read-only view
            src = torch.frombuffer(mine, dtype=torch.uint8)
            dst = torch.frombuffer(all_, dtype=torch.uint8)
        what = "the fingerprints" if calls[0] == 0 else f"round {calls[0]} of chunks"
        calls[0] += 1
        try:
            # Raw bytes: gloo in torch 1.13 refuses some dtypes, uint8 goes through.
            dist.all_gather(list(dst.chunk(world)), src, group=group)
        except Exception as e:
            # A peer that died (its connection reset) or stalled past the process group's
            # timeout: gloo's error, said where it happened.
            raise RuntimeError(f"kiln.torch.load(group=): rank {rank} of {world}: the "
                               f"all-gather of {what} failed: {e}") from e

    r = d.group_load(pairs, rank, world, all_gather)
    for i, buf in raw.items():
        final[i] = _shaped(views[i], buf)
    # After every exchange: a rank whose share cannot be read fails alone, while the others,
    # done with the group, are not left waiting for it.
    tp_bytes = d.read_slices(slices) if slices else 0
    for i, shape, buf in shares:
        final[i] = buf.view(_dtype(views[i])).reshape(shape)
    if stats is not None:
        stats.update(r, tp_bytes_read=tp_bytes, rank=rank, world=world)
    return final


def _gpus():
    """kiln's CUDA devices, or None where this build has no adapter or it cannot open the GPUs
    torch sees (the pinned path is then taken)."""
    if not _cuda.available():
        return None
    try:
        return _cuda._handle()
    except (RuntimeError, _kiln.Error):
        return None


def load(path, device="cpu", *, threads=None, order=None, progress=None, group=None, tp=None,
         stats=None, timeout=0):
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
    to its GPU as soon as it is ready (non-blocking), so the copies overlap the reads. A URL is
    read with ranged GETs straight into the tensors' memory; with a cache configured
    (KILN_CACHE_DIR) it is opened through the cache instead, which keeps the object.

    ``group`` (a torch.distributed process group, or True for the default one): every rank of the
    group calls load with the path of its own copy of the same model (one node's disk, or the
    same path on a shared file system), and the group reads it once between them: each byte is
    read by one rank and all-gathered to the others (raw bytes, so gloo's dtype limits do not
    apply), every rank ending with every tensor, bit for bit what a one-process load gives.
    Copies that differ (sizes, directory bytes, a URL's ETag) raise before any exchange; copies
    with the same headers and other bytes (two fine-tunes) raise in the first round, every rank
    naming the first tensor that differs (each rank compares 4 KiB of every chunk it receives
    with its own copy). Every
    rank may pass one URL: each fetches only its chunks. A rank that dies closes its
    connections and the others raise at once; one that stalls makes them raise once the process
    group's timeout passes (``timeout=`` of init_process_group; torch's default is 30 minutes).
    ``tp`` ({fnmatch pattern: axis}): a matching tensor comes as this rank's share,
    ``torch.tensor_split(t, world, dim=axis)[rank]``, read by this rank alone (only its bytes
    from a file; over a URL an inner axis's rows come with the gaps between them); others
    whole.
    ``stats`` (a dict): filled with bytes_read, bytes_received, bytes_verified, tp_bytes_read,
    rank and world.
    ``timeout``: for a URL, seconds each operation (the open, each read) may take, retries
    included, before kiln.FileError (ETIMEDOUT); 0: kiln's own limits per request only.
    With a group, tensors are on the CPU (move them after) and threads/order/progress do not
    apply.
    """
    if tp is not None and group is None:
        raise ValueError("tp= needs group=: the shares are of the group's ranks")
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 16):
        raise ValueError(f"threads must be 1 to 16, not {threads!r}")
    place, devices = _placement(device)
    for dev in devices:
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {dev}: this PyTorch ({torch.__version__}) has no CUDA "
                               f"device (torch.cuda.is_available() is False)")
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device {dev}: kiln.torch.load places tensors on cpu or cuda")

    # Directory-only: the pipeline reads the payload straight into the tensors' memory, from a
    # file or with ranged GETs, so a URL is not fetched whole into memory first. A URL with a
    # cache configured (KILN_CACHE_DIR) is opened whole, through the cache, unless a group
    # reads it (each rank then fetches only its chunks).
    whole = (group is None and _kiln.is_url(path) and bool(_os.environ.get("KILN_CACHE_DIR")))
    with _kiln.open(path, directory_only=not whole, timeout=timeout) as d:
        views = [d[i] for i in range(len(d))]
        keys = [t.name if t.name is not None else i for i, t in enumerate(views)]
        sequence = _sequence(keys, order, path)

        if group is not None:
            import torch.distributed as dist

            pg = dist.group.WORLD if group is True else group
            if any(dev.type != "cpu" for dev in devices):
                raise ValueError("group=: tensors are loaded on the CPU (move them after)")
            final = _group_load(d, views, sequence, pg, tp, stats)
            return {keys[i]: final[i] for i in range(len(views))}
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
                final[i] = _shaped(views[i], torch.utils.dlpack.from_dlpack(cap))
        elif all(dev.type == "cuda" for dev in targets.values()) and _gpus() is not None:
            # kiln's pipeline into GPU memory: pinned staging, a stream per buffer, one arena
            # per GPU; each tensor a DLPack view of its bytes there.
            where = [targets[i].index if targets[i].index is not None
                     else torch.cuda.current_device() for i in sequence]
            r = d.load([views[i] for i in sequence], threads=threads or 0, progress=progress,
                       arena=True, device=_gpus(), place=where)
            for i, v in zip(sequence, r["views"]):
                final[i] = _shaped(views[i], torch.utils.dlpack.from_dlpack(
                    v.to_dlpack(raw=True)))
        else:
            raw, pairs = {}, []
            for i in sequence:
                t = views[i]
                buf = _host_buffer(t.nbytes, targets[i].type == "cuda")
                raw[i] = buf
                pairs.append((t, buf.numpy()))
            position = {id(views[i]): i for i in sequence}

            def on_ready(key):
                # Each tensor to its GPU as soon as it is in pinned memory: copies overlap
                # the reads of the next ones.
                i = position[id(key)]
                out = _shaped(views[i], raw[i])
                final[i] = out.to(targets[i], non_blocking=True) if targets[i].type == "cuda" else out

            d.load(pairs, threads=threads or 0, progress=progress, on_ready=on_ready)
    if any(dev.type == "cuda" for dev in targets.values()):
        torch.cuda.synchronize()  # the pinned path's copies (kiln's own are done)
    return {keys[i]: final[i] for i in range(len(views))}
