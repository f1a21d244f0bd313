# Stand-in for python/sglang/srt/model_loader/__init__.py at sgl-project/sglang@5c4ca8cef2c41a3c0da4b7d3c4930a0bc7b9b03b; only what kiln's loader touches.
"""get_model and the loader names, as upstream re-exports them."""

from sglang.srt.model_loader.loader import BaseModelLoader, get_model_loader


def get_model(*, model_config, load_config, device_config):
    loader = get_model_loader(load_config, model_config)
    return loader.load_model(model_config=model_config, device_config=device_config)


__all__ = ["get_model", "get_model_loader", "BaseModelLoader"]
