# Stand-in for vllm/model_executor/model_loader/__init__.py at vllm-project/vllm@e9234694f494887ddbeafed08095a1dfa5745369; only what kiln's loader touches.
"""The load-format registry. As upstream: ``register_model_loader(load_format)`` is a decorator
factory; the decorated class must be a subclass of BaseModelLoader (ValueError otherwise; a
non-class makes issubclass raise TypeError); re-registering a name logs a warning and replaces
it; get_model_loader(load_config) instantiates the class registered for
``load_config.load_format`` with ``load_config``, or raises ValueError for an unknown name.
Upstream's built-in formats are registered here to a placeholder that refuses to run, so that
overwriting one warns as upstream does."""

import logging

from vllm.config import LoadConfig, ModelConfig, VllmConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

logger = logging.getLogger(__name__)

_BUILTIN_FORMATS = ("auto", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "mistral",
                    "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors",
                    "sharded_state", "tensorizer")


class _BuiltinNotInStandIn(BaseModelLoader):
    def __init__(self, load_config):
        raise NotImplementedError(f"load format {load_config.load_format!r} is one of vLLM's "
                                  "own loaders, which the stand-in does not have")

    download_model = load_weights = __init__  # never reached: __init__ refuses


_LOAD_FORMAT_TO_MODEL_LOADER: dict[str, type[BaseModelLoader]] = {
    name: _BuiltinNotInStandIn for name in _BUILTIN_FORMATS}


def register_model_loader(load_format: str):
    """Decorator: ``@register_model_loader("name")`` on a BaseModelLoader subclass."""

    def _wrapper(model_loader_cls):
        if load_format in _LOAD_FORMAT_TO_MODEL_LOADER:
            logger.warning("Load format `%s` is already registered, and will be overwritten "
                           "by the new loader class `%s`.", load_format, model_loader_cls)
        if not issubclass(model_loader_cls, BaseModelLoader):
            raise ValueError("The model loader must be a subclass of `BaseModelLoader`.")
        _LOAD_FORMAT_TO_MODEL_LOADER[load_format] = model_loader_cls
        logger.info("Registered model loader `%s` with load format `%s`", model_loader_cls,
                    load_format)
        return model_loader_cls

    return _wrapper


def get_model_loader(load_config: LoadConfig) -> BaseModelLoader:
    load_format = load_config.load_format
    if load_format not in _LOAD_FORMAT_TO_MODEL_LOADER:
        raise ValueError(f"Load format `{load_format}` is not supported")
    return _LOAD_FORMAT_TO_MODEL_LOADER[load_format](load_config)


def get_model(*, vllm_config: VllmConfig, model_config: ModelConfig | None = None):
    loader = get_model_loader(vllm_config.load_config)
    if model_config is None:
        model_config = vllm_config.model_config
    return loader.load_model(vllm_config=vllm_config, model_config=model_config)


__all__ = ["get_model", "get_model_loader", "register_model_loader", "BaseModelLoader"]
