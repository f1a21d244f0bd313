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

__all__ = ["load", "iter_load", "IterLoad"]


def _dtype(t):
    """The torch dtype of a kiln Tensor, or None when torch has none (its bytes come as uint8)."""
    row = _dtypes.KILN.get(t.dtype)
    return row.torch_dtype() if row else None


_HUGE = 4 << 20


def _host_buffer(n):
    """n bytes of host memory a tensor owns. Large ones are a private mapping advised
    MADV_HUGEPAGE, as kiln's own blocks: fresh 4 KiB pages cost more to fault in than the read."""
    if n < _HUGE:
        return torch.empty(n, dtype=torch.uint8)
    m = _mmap.mmap(-1, n, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
    try:
        m.madvise(_mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):
        pass  # a hint
    with _warnings.catch_warnings():
        _warnings.simplefilter("ignore")  # frombuffer's note on shared memory
        return torch.frombuffer(m, dtype=torch.uint8)  # keeps a reference to m


def _cudart():
    """CUDA's runtime as torch binds it (cudaHostRegister and cudaHostUnregister), or None."""
    try:
        rt = torch.cuda.cudart()
    except Exception:  # noqa: BLE001 (no CUDA in this torch, or no driver)
        return None
    ok = hasattr(rt, "cudaHostRegister") and hasattr(rt, "cudaHostUnregister")
    return rt if ok else None


class _Staging:
    """Pinned host memory of exactly n bytes (CUDA pins the pages they touch) for the copies to
    a GPU: an anonymous mapping registered with cudaHostRegister, not torch's caching host
    allocator, which rounds each block up to a power of two (up to 2x the checkpoint pinned) and keeps it
    cached after the load. Pageable where registering fails (the copies are then synchronous).
    release() unregisters; call it only after the copies from it completed."""

    def __init__(self, n, cudart=None):
        self._map = _mmap.mmap(-1, max(n, 1), flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore")  # frombuffer's note on shared memory
            self.buffer = torch.frombuffer(self._map, dtype=torch.uint8)[:n]
        self._rt = cudart if cudart is not None else _cudart()
        self.pinned = False
        if self._rt is not None and n:
            self._ptr = self.buffer.data_ptr()
            err = self._rt.cudaHostRegister(self._ptr, len(self._map), 0)
            self.pinned = int(getattr(err, "value", err)) == 0

    def release(self):
        if self.pinned:
            self.pinned = False
            self._rt.cudaHostUnregister(self._ptr)
        self.buffer = None  # the mapping goes with the last tensor viewing it


def _check_threads(threads):
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 16):
        raise ValueError(f"threads must be 1 to 16, not {threads!r}")


def _check_device(dev, who):
    """A torch.device kiln can place tensors on: the CPU, or a GPU this PyTorch has."""
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {dev}: {who} places tensors on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {dev}: this PyTorch ({torch.__version__}) has no CUDA "
                           f"device (torch.cuda.is_available() is False)")


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


def _all_gather(group, rank, world, who):
    """The collective of kiln's group loads: all_gather(mine, all) over the process group, raw
    bytes (gloo in torch 1.13 refuses some dtypes; uint8 goes through), its failures said with
    rank, world and round."""
    import torch.distributed as dist

    calls = [0]

    def all_gather(mine, all_):
        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore")  # frombuffer of a read-only view
            src = torch.frombuffer(mine, dtype=torch.uint8)
            dst = torch.frombuffer(all_, dtype=torch.uint8)
        what = "the fingerprints" if calls[0] == 0 else f"round {calls[0]} of chunks"
        calls[0] += 1
        try:
            dist.all_gather(list(dst.chunk(world)), src, group=group)
        except Exception as e:
            # A peer that died (its connection reset) or stalled past the process group's
            # timeout: gloo's error, said where it happened.
            raise RuntimeError(f"{who}: rank {rank} of {world}: the all-gather of {what} "
                               f"failed: {e}") from e
    return all_gather


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
            buf = _host_buffer(n)
            shares.append((i, shape, buf))
            slices.append((t, axis, start, stop, buf.numpy()))
            continue
        raw[i] = _host_buffer(t.nbytes)
        pairs.append((t, raw[i].numpy()))

    all_gather = _all_gather(group, rank, world, "kiln.torch.load(group=)")
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
         stats=None, timeout=0, verify=False):
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
    ``verify=True``: every byte checked against the model's digests (docs/integrity.md) as it
    is read, before any tensor is handed out: a file's own table (kiln's writers put one in),
    or a sidecar from ``klnt digest``, checks each part the load reads as it lands, from a
    file, a URL's ranged GETs, or a group's exchange (each rank checks what it reads and what
    it receives, which also finds a rank with another checkpoint). A model whose only digests
    hash whole files (a model_signing statement, a Hugging Face cache blob name) is opened
    whole and checked as its pages come in, then copied (not with group=). kiln.CorruptError
    names the file, tensor and chunk that differ; kiln.Error (NOTFOUND) says how to make
    digests.
    """
    if tp is not None and group is None:
        raise ValueError("tp= needs group=: the shares are of the group's ranks")
    _check_threads(threads)
    place, devices = _placement(device)
    for dev in devices:
        _check_device(dev, "kiln.torch.load")

    # Directory-only: the pipeline reads the payload straight into the tensors' memory, from a
    # file or with ranged GETs, so a URL is not fetched whole into memory first. A URL with a
    # cache configured (KILN_CACHE_DIR) is opened whole, through the cache, unless a group
    # reads it (each rank then fetches only its chunks).
    whole = (group is None and _kiln.is_url(path) and bool(_os.environ.get("KILN_CACHE_DIR")))
    with _open_checked(path, whole=whole, verify=bool(verify), timeout=timeout,
                       grouped=group is not None) as d:
        # The model's tensors: not the converters' metadata document (Tensor.role).
        views = [t for t in (d[i] for i in range(len(d))) if t.role == "model"]
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
            # Tensors for the CPU own their memory; those for a GPU are staged in one pinned
            # block of their exact size, released once the copies from it are done.
            raw, pairs, at, end = {}, [], {}, 0
            for i in sequence:
                if targets[i].type == "cuda":
                    at[i] = -(-end // 64) * 64
                    end = at[i] + views[i].nbytes
            staging = _Staging(end) if at else None
            for i in sequence:
                t = views[i]
                if i in at:
                    buf = staging.buffer[at[i]:at[i] + t.nbytes]
                else:
                    buf = _host_buffer(t.nbytes)
                raw[i] = buf
                pairs.append((t, buf.numpy()))
            position = {id(views[i]): i for i in sequence}

            def on_ready(key):
                # Each tensor to its GPU as soon as it is in pinned memory: copies overlap
                # the reads of the next ones.
                i = position[id(key)]
                out = _shaped(views[i], raw[i])
                final[i] = out.to(targets[i], non_blocking=True) if targets[i].type == "cuda" else out

            try:
                d.load(pairs, threads=threads or 0, progress=progress, on_ready=on_ready)
            finally:
                if staging is not None:
                    torch.cuda.synchronize()  # the copies from the staging, failed load or not
                    staging.release()
    return {keys[i]: final[i] for i in range(len(views))}


# ---------------------------------------------------------------------------------------------
# iter_load: a stream of (name, tensor) with bounded read-ahead


def _natural_key(path):
    """Natural order of file names: runs of digits compared as numbers ("w-2" before "w-10")."""
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path))]


# kiln dtype names whose typed DLPack capsule every PyTorch kiln supports takes: the C call hands
# these out typed; the rest come as bytes and are viewed in Python.
_TYPED = tuple(row.kiln for row in _dtypes.ROWS if row.kiln and row.torch_dlpack)


_DEFAULT_WINDOW = 256 << 20


class _Plan:
    """One tensor to hand out: which model, its index there, its name, bytes, and how to shape
    it (None: the capsule is typed already)."""

    __slots__ = ("model", "index", "name", "nbytes", "view")

    def __init__(self, model, index, name, nbytes, view):
        self.model, self.index, self.name, self.nbytes, self.view = model, index, name, nbytes, view


class IterLoad:
    """The iterator kiln.torch.iter_load returns: ``(name, tensor)`` pairs, and ``close()``
    (also on ``with`` exit and when garbage-collected), which stops the read ahead and frees
    what was not handed out. Attributes: ``total_bytes`` (payload bytes it will hand out),
    ``bytes_done`` (handed out so far), ``tensors`` (how many it will hand out),
    ``peak_ahead`` (the most bytes read but not yet handed out at once)."""

    def __init__(self, models, plan, batches, *, device, threads, group, progress):
        self._models = models
        self._plan = plan
        self._batches = batches  # lists of positions in plan, each at most half the window
        self._device = device
        self._threads = threads
        self._group = group
        self._progress = progress
        self._ready = []  # (name, tensor) of the batch being handed out, reversed
        self._next = 0  # the next batch to read
        self._future = None
        self._pool = None
        self._closed = False
        self.tensors = len(plan)
        self.total_bytes = sum(p.nbytes for p in plan)
        self.bytes_done = 0
        self.bytes_read = 0
        self.bytes_received = 0
        self.peak_ahead = 0
        self._ahead = 0
        if group is None and len(batches) > 1:
            # Read ahead on one thread while the consumer takes the previous batch: the reads
            # release the GIL. Not with a group: its collectives must stay in the consumer's
            # order on the consumer's thread, where the runtime's own collectives run.
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kiln-iter-load")

    def __iter__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def __next__(self):
        if self._ready:
            return self._hand_out()
        if self._closed:
            raise StopIteration
        try:
            if self._future is None and self._next < len(self._batches):
                self._start()
            if self._future is None:
                self.close()
                raise StopIteration
            fut, self._future = self._future, None
            got = fut.result() if self._pool is not None else fut()
            # The next batch is read while this one is consumed: at most two in memory.
            if self._next < len(self._batches):
                self._start()
            self._ready = got[::-1]
            if self._progress is not None:
                self._progress(self.bytes_done + sum(p.nbytes for _, _, p in self._ready),
                               self.total_bytes)
        except BaseException:
            self.close()
            raise
        return self._hand_out()

    def _hand_out(self):
        name, tensor, plan = self._ready.pop()
        self.bytes_done += plan.nbytes
        self._ahead -= plan.nbytes
        return name, tensor

    def _start(self):
        batch = self._batches[self._next]
        self._next += 1
        self._ahead += sum(self._plan[i].nbytes for i in batch)
        self.peak_ahead = max(self.peak_ahead, self._ahead)
        if self._pool is not None:
            self._future = self._pool.submit(self._read, batch)
        else:
            self._future = lambda: self._read(batch)

    def _inflight(self, positions):
        # kiln_load cuts its list into pieces of inflight / threads and runs no more threads
        # than pieces: a batch smaller than its default piece (128 MiB) would be read by one
        # thread.
        # Half the batch, at least 1 MiB a thread: several pieces a thread, evenly shared.
        n = sum(self._plan[i].nbytes for i in positions)
        return max(2 << 20, min(64 << 20, n // 2))

    def _stop_check(self, done, total):
        # kiln's progress callback on the reading thread: raising stops the read (close()).
        if self._closed:
            raise _Closed()

    def _read(self, batch):
        """Read one batch (of one model: iter_load cuts batches where the model changes):
        [(name, tensor, plan)] in file order."""
        d = self._plan[batch[0]].model
        keys = [self._plan[i].index for i in batch]
        if self._group is not None:
            got = self._read_group(d, batch)
        elif self._device is not None and self._device.type == "cuda" and _gpus() is not None:
            r = d.load(keys, threads=self._threads, arena=True, device=_gpus(),
                       inflight=self._inflight(batch),
                       place=self._device.index if self._device.index is not None
                       else torch.cuda.current_device(), progress=self._stop_check)
            self.bytes_read += r["bytes"]
            got = []
            for i, v in zip(batch, r["views"]):
                view = self._plan[i].view
                g = torch.utils.dlpack.from_dlpack(v.to_dlpack(raw=view is not None))
                got.append(g if view is None else _shaped(view, g))
        else:
            # One block per batch, each tensor a DLPack capsule holding it: typed by the C call
            # where DLPack has the dtype, so a small tensor costs one call.
            r = d.load(keys, threads=self._threads, arena=True, typed=_TYPED,
                       inflight=self._inflight(batch), progress=self._stop_check)
            self.bytes_read += r["bytes"]
            got = [torch.utils.dlpack.from_dlpack(c) for c in r["capsules"]]
            for k, i in enumerate(batch):
                p = self._plan[i]
                if p.view is not None:
                    got[k] = _shaped(p.view, got[k])
            if self._device is not None and self._device.type == "cuda":
                got = [g.to(self._device) for g in got]
        return [(self._plan[i].name, g, self._plan[i]) for i, g in zip(batch, got)]

    def _read_group(self, d, positions):
        import torch.distributed as dist

        rank, world = dist.get_rank(self._group), dist.get_world_size(self._group)
        pairs, bufs = [], []
        for i in positions:
            p = self._plan[i]
            buf = _host_buffer(p.nbytes)
            bufs.append(buf)
            pairs.append((p.index, buf.numpy()))
        r = d.group_load(pairs, rank, world,
                         _all_gather(self._group, rank, world, "kiln.torch.iter_load(group=)"))
        self.bytes_read += r["bytes_read"]
        self.bytes_received += r["bytes_received"]
        return [_shaped(d[self._plan[i].index], b) for i, b in zip(positions, bufs)]

    def close(self):
        """Stop reading ahead and free what was not handed out (tensors handed out stay
        valid). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._ready = []
        fut, self._future = self._future, None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            if fut is not None and not fut.cancelled():
                try:
                    fut.result()
                except BaseException:  # noqa: BLE001 (the stop raised in it, or its own error)
                    pass
        for d in self._models:
            d.close()
        self._models = []


class _Closed(Exception):
    """Raised by the progress hook of an iterator being closed: stops its read."""


def _open_checked(path, *, whole=False, verify=False, timeout=0, one_file=False,
                  grouped=False):
    """The model for a load: directory-only unless ``whole``, its reads then checked as they
    land when ``verify`` (chunk digests: the file's own table or a sidecar). Digests that hash
    whole files (model_signing, the Hugging Face cache) check nothing of a part: such a model is
    opened whole instead and checked as it comes in, which a group (each rank reading a share)
    cannot do."""
    try:
        return _kiln.open(path, one_file=one_file, directory_only=not whole, verify=verify,
                          timeout=timeout)
    except _kiln.Error as e:
        if not (verify and not whole and e.cls == "UNSUPPORTED" and e.field == "digests"):
            raise
        if grouped:
            raise ValueError(f"verify=True with group=: {e}; every rank would read its whole "
                             "copy (make chunk digests with klnt digest)") from e
        return _kiln.open(path, one_file=one_file, verify=True, timeout=timeout)


def iter_load(path_or_paths, *, device="cpu", window_bytes=_DEFAULT_WINDOW, threads=None,
              group=None, skip=None, verify=False, progress=None, timeout=0):
    """A stream of ``(name, tensor)`` over every tensor of a model, with bounded read-ahead.

    ``path_or_paths``: what kiln.open takes (a file, any shard of a series, an index, a URL; a
    series is read whole), or a list of files, each opened alone and read in natural order
    (``w-2`` before ``w-10``). Tensors come whole, in the checkpoint's dtype (raw uint8 bytes
    where PyTorch lacks it, as kiln.torch.load), files in order and each file's tensors in file
    order; unnamed tensors (KLNT) are named by their index as a string. A name in two files of
    the list is a ValueError before any byte is read.

    Memory: tensors are read in batches of at most ``window_bytes / 2`` (a larger tensor is a
    batch alone), the next batch read on another thread while the consumer takes the current
    one, so at most ``window_bytes`` (or the largest tensor and the batch before it) are read
    and not yet handed out. Each tensor holds its memory: it stays valid after later ``next()``
    calls and after the iterator is closed, and a batch's block is freed once the last tensor
    of it is gone (a consumer keeping a tensor keeps that block). ``close()`` (or leaving a
    ``with`` block, or dropping the iterator) stops the read ahead and frees what was not handed
    out.

    ``skip(name) -> bool``: called once per tensor before anything is read; a skipped tensor
    is never read (expert-parallel ranks). ``device``: "cpu" or "cuda:N" (through kiln's CUDA
    pipeline where the adapter is built, else copied from host memory). ``threads``: kiln's
    reader threads per batch (None: its default). ``group`` (a torch.distributed process group,
    or True for the default one): every rank reads its own copy of the same model and the group
    reads each byte once, all-gathered (as kiln.torch.load(group=)); every rank consumes the
    same sequence (``skip`` must agree across ranks), read on the consumer's thread. ``verify``:
    check every byte against the model's digests (docs/integrity.md) as each batch is read,
    before its tensors are handed out (as kiln.torch.load(verify=True); a model with only
    whole-file digests is opened and verified whole first). ``progress(done, total)``: payload
    bytes read so far, on the consumer's thread, once per batch. ``timeout``: as
    kiln.torch.load.
    """
    _check_threads(threads)
    if (not isinstance(window_bytes, int) or isinstance(window_bytes, bool)
            or window_bytes < 2 << 20):
        raise ValueError(f"window_bytes must be an int of at least 2 MiB, not {window_bytes!r}")
    if skip is not None and not callable(skip):
        raise TypeError("skip must be a callable taking a tensor name")
    dev = None
    if device is not None and str(device) != "cpu":
        dev = torch.device(device)
        _check_device(dev, "kiln.torch.iter_load")
        if group is not None:
            raise ValueError("group=: tensors are loaded on the CPU (move them after)")
    if group is True:
        import torch.distributed as dist

        group = dist.group.WORLD

    if isinstance(path_or_paths, (str, bytes, _os.PathLike)):
        paths, one_file = [path_or_paths], False
    else:
        paths = sorted(path_or_paths, key=_natural_key)
        if not paths:
            raise ValueError("iter_load: no files given")
        one_file = True
    models, plan, seen = [], [], {}
    try:
        for path in paths:
            d = _open_checked(path, one_file=one_file, verify=bool(verify), timeout=timeout)
            models.append(d)
            for i in range(len(d)):
                t = d[i]
                if t.role != "model":
                    continue  # the converters' metadata document is not a weight
                name = t.name if t.name is not None else str(i)
                if name in seen and one_file:
                    raise ValueError(f"iter_load: tensor {name!r} is in {seen[name]} and in "
                                     f"{_kiln.shown(str(path))}")
                seen[name] = _kiln.shown(str(path))
                if skip is not None and skip(name):
                    continue
                plan.append(_Plan(d, i, name, t.nbytes, None if t.dtype in _TYPED else t))
    except BaseException:
        for d in models:
            d.close()
        raise
    half = window_bytes // 2
    batches, cur, size = [], [], 0
    for k, p in enumerate(plan):
        if cur and (size + p.nbytes > half or p.model is not plan[cur[-1]].model):
            batches.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += p.nbytes
    if cur:
        batches.append(cur)
    return IterLoad(models, plan, batches, device=dev, threads=threads or 0, group=group,
                    progress=progress)
