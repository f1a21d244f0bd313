# Stand-in for python/sglang/srt/model_loader/loader.py at sgl-project/sglang@4632493515f269ad6749a13abe1b28fa3ae6d710; only what kiln's loader touches.
"""BaseModelLoader and get_model_loader. SGLang's BaseModelLoader has two abstract methods,
download_model(model_config) and load_model(*, model_config, device_config) -- no
load_weights: a loader builds, fills and post-processes the model itself. get_model_loader
follows upstream's order: ModelOpt quantization in model_config wins first; then a
``load_format`` that is a class (not a string) is instantiated with the load_config -- the
way a third-party loader is taken; then the built-in formats, which the stand-in does not
have. _initialize_model(model_config, load_config) is upstream's private builder; the
stand-in takes the model from ModelConfig.model_factory (stand-in only)."""

from abc import ABC, abstractmethod
from typing import Optional

from torch import nn

from sglang.srt.configs.load_config import LoadConfig


def _initialize_model(model_config, load_config: LoadConfig) -> nn.Module:
    factory = getattr(model_config, "model_factory", None)
    if factory is None:
        raise NotImplementedError("the stand-in cannot resolve a model architecture: pass "
                                  "ModelConfig(model_factory=...)")
    return factory if isinstance(factory, nn.Module) else factory()


class BaseModelLoader(ABC):
    """Base class for model loaders."""

    def __init__(self, load_config: LoadConfig):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config) -> None:
        """Download a model so that it can be immediately loaded."""
        raise NotImplementedError

    @abstractmethod
    def load_model(self, *, model_config, device_config) -> nn.Module:
        """Load a model with the given configurations."""
        raise NotImplementedError


def get_model_loader(load_config: LoadConfig, model_config: Optional[object] = None
                     ) -> BaseModelLoader:
    if model_config is not None and (
            getattr(model_config, "modelopt_quant", None)
            or getattr(model_config, "quantization", None) in ("modelopt_fp8", "modelopt_fp4")):
        raise NotImplementedError("upstream returns its ModelOptModelLoader here, before "
                                  "looking at load_format; the stand-in does not have it")
    if isinstance(load_config.load_format, type):
        return load_config.load_format(load_config)
    raise NotImplementedError(f"load format {load_config.load_format!r} is one of SGLang's own "
                              "loaders, which the stand-in does not have")
