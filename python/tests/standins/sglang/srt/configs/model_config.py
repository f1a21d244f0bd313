# Stand-in for python/sglang/srt/configs/model_config.py at sgl-project/sglang@8b5e1bbf72cca54c4275463b08d835d2f7221703; only what kiln's loader touches.
"""ModelConfig with what a weight loader reads: model_path (SGLang's name; vLLM says
``model``), revision, dtype (a torch.dtype after init), quantization. Upstream reads the
checkpoint's HF config (and resolves dtype "auto" from it); the stand-in does not, so "auto"
becomes float32. ``model_factory`` is the stand-in's own: an nn.Module or a zero-argument
callable that the stand-in's _initialize_model returns/calls."""

from typing import Any, Optional

import torch

_DTYPES = {"half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float": torch.float32, "float32": torch.float32, "auto": torch.float32}


class ModelConfig:
    def __init__(self, model_path: str, trust_remote_code: bool = True,
                 revision: Optional[str] = None, dtype: Any = "auto",
                 quantization: Optional[str] = None, model_factory: Any = None) -> None:
        self.model_path = model_path
        self.trust_remote_code = trust_remote_code
        self.revision = revision
        self.quantization = quantization
        if isinstance(dtype, str):
            if dtype.lower() not in _DTYPES:
                raise ValueError(f"Unknown dtype: {dtype}")
            dtype = _DTYPES[dtype.lower()]
        self.dtype = dtype
        self.model_factory = model_factory
