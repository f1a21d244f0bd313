# SPDX-License-Identifier: MIT
"""kiln.cuda: a model's tensors loaded into GPU memory by kiln's pipeline (kiln_load onto the CUDA
adapter's devices: reader threads, pinned staging, a stream per staging buffer), handed out as
DLPack views on the device (kDLCUDA). Needs no CUDA-enabled torch: any DLPack consumer (CuPy,
JAX, a CUDA torch) takes the views, and kiln.cuda.to_host() reads them back. Only where kiln was
built with the CUDA adapter (the CUDA toolkit at build time): see available().
"""

import fnmatch
import threading

from . import _kiln, _sequence

__all__ = ["available", "device_count", "load", "to_host"]

_lock = threading.Lock()
_devices = None


def available():
    """Whether this build of kiln has the CUDA adapter (a GPU may still be absent)."""
    return hasattr(_kiln, "cuda_devices")


def _handle():
    """The GPUs as a load device, opened once per process (kiln.Error when none is usable)."""
    global _devices
    if not available():
        raise RuntimeError("kiln was built without the CUDA adapter (no CUDA toolkit at build "
                           "time): kiln.cuda cannot load onto a GPU")
    with _lock:
        if _devices is None:
            _devices = _kiln.cuda_devices()
        return _devices


def device_count():
    """The GPUs kiln can load onto (0 when none is usable or the adapter is not built)."""
    try:
        handle = _handle()
    except (RuntimeError, _kiln.Error):
        return 0
    return _kiln.cuda_device_count(handle)


def _index(device):
    """A CUDA device number from N, "cuda", "cuda:N" or a torch.device."""
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device {device!r}: kiln.cuda loads onto \"cuda:N\" (or N)")


def load(path, device=0, *, threads=None, order=None, progress=None, register=False):
    """Every tensor of the model at ``path`` (any model kiln opens, a URL too) as a dict name ->
    kiln.DeviceView, in file order, the bytes in GPU memory.

    ``device``: N, "cuda:N" ("cuda" is device 0), or {fnmatch pattern: device} (the first
    pattern matching a name wins). One arena per GPU used holds the tensors; it is freed when the last view (and every
    DLPack capsule made from one) is gone. ``threads``, ``order`` and ``progress`` are as in
    kiln.torch.load. Each view's ``__dlpack__()`` is typed (``to_dlpack(raw=True)`` gives any
    dtype's bytes as uint8), ``__dlpack_device__()`` is (2, N); every copy has completed when
    load returns. Unnamed tensors are keyed by their index.

    ``register=True``: no pinned staging. The model is opened whole (mapped; a URL cannot be),
    and the file's own pages are registered with CUDA a window at a time and copied from
    (KILN_LOAD_REGISTER, docs/pipeline.md). Which of the two is faster depends on the machine.
    """
    if isinstance(device, dict):
        rules = [(str(p), _index(d)) for p, d in device.items()]
        if not rules:
            raise ValueError("device={} maps no tensor anywhere")

        def place(name):
            for pattern, dev in rules:
                if fnmatch.fnmatchcase(name, pattern):
                    return dev
            raise ValueError(f"tensor {name!r} matches no pattern of device=")
    else:
        one = _index(device)

        def place(name):
            return one
    handle = _handle()
    # Registered pages are read-only shared ones: pinning a writable private mapping breaks
    # its copy-on-write (the pages stop following the file, and a write lands in memory CUDA
    # copies from).
    with _kiln.open(path, directory_only=not register, copy_on_write=not register) as d:
        views = [d[i] for i in range(len(d))]
        keys = [t.name if t.name is not None else i for i, t in enumerate(views)]
        sequence = _sequence(keys, order, path)
        where = [place(str(keys[i])) for i in sequence]
        r = d.load([views[i] for i in sequence], threads=threads or 0, progress=progress,
                   arena=True, device=handle, place=where, register=register)
        got = dict(zip(sequence, r["views"]))
    return {keys[i]: got[i] for i in range(len(views))}


def to_host(view):
    """A DeviceView's bytes, copied back to host memory (bytes)."""
    return _kiln.cuda_to_host(view)
