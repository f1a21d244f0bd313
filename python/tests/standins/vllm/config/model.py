# Stand-in for vllm/config/model.py at vllm-project/vllm@18ec6629253632af0a384f2ffbb8c6b28af322e7; only what kiln's loader touches.
"""ModelConfig with the fields a weight loader reads (model, revision, dtype, quantization).
Upstream reads the checkpoint's config.json and resolves dtype "auto" from it; there is no
checkpoint config here, so "auto" becomes float32 and names map as upstream's table does.
``model_factory`` is the stand-in's own (not upstream): a zero-argument callable returning the
nn.Module, or the nn.Module itself, which the stand-in's initialize_model uses where upstream
would resolve the architecture through its ModelRegistry."""

from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float": torch.float32, "float32": torch.float32, "auto": torch.float32}


@dataclass
class ModelConfig:
    model: str = "Qwen/Qwen3-0.6B"
    revision: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool = False
    dtype: Any = "auto"
    quantization: str | None = None
    model_factory: Any = None  # stand-in only; see the module docstring

    def __post_init__(self):
        if self.tokenizer is None:
            self.tokenizer = self.model
        if isinstance(self.dtype, str):
            if self.dtype.lower() not in _DTYPES:
                raise ValueError(f"Unknown dtype: {self.dtype!r}")
            self.dtype = _DTYPES[self.dtype.lower()]
