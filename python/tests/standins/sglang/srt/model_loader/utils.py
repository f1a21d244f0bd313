# Stand-in for python/sglang/srt/model_loader/utils.py at sgl-project/sglang@15a5761cc01fef0c887903b9013d2019b6333533; only what kiln's loader touches.
"""set_default_torch_dtype only (the architecture registry is not mirrored)."""

import contextlib

import torch


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
