# Stand-in for vllm/model_executor/model_loader/utils.py at vllm-project/vllm@3d333269ca2218f2ec4c19d2bfd738f555be3000; only what kiln's loader touches.
"""set_default_torch_dtype, initialize_model and process_weights_after_loading, reduced.
initialize_model takes the model from ModelConfig.model_factory (stand-in only) instead of
resolving the architecture; a factory is called under the target device's context where
torch has one (2.0+), and a ready module is moved to the device. ``device`` is the
stand-in's own keyword. process_weights_after_loading calls each module's
``quant_method.process_weights_after_loading(module)`` where one is set, as upstream does for
QuantizeMethodBase (its CPU-offload device juggling and MLA pass are left out)."""

import contextlib

import torch
from torch import nn


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def initialize_model(vllm_config, *, prefix: str = "", model_class=None, model_config=None,
                     device=None) -> nn.Module:
    if model_config is None:
        model_config = vllm_config.model_config
    factory = model_class or getattr(model_config, "model_factory", None)
    if factory is None:
        raise NotImplementedError("the stand-in cannot resolve a model architecture: set "
                                  "ModelConfig.model_factory to an nn.Module or a callable")
    if isinstance(factory, nn.Module):
        return factory if device is None else factory.to(device)
    if device is not None and hasattr(torch.device, "__enter__"):
        with torch.device(device):
            return factory()
    model = factory()
    return model if device is None else model.to(device)


def process_weights_after_loading(model: nn.Module, model_config, target_device) -> None:
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(module)
