# Stand-in for vllm/model_executor/model_loader/base_loader.py at vllm-project/vllm@7679f4d267e47fdd3cc1450b62a7dc7604c380d1; only what kiln's loader touches.
"""BaseModelLoader: the abstract download_model/load_weights pair and upstream's load_model
order in simplified form: pick the load device (load_config.device, else
device_config.device); with the default dtype set to model_config.dtype, build the model
(on the load device where torch supports device contexts); load_weights; then
process_weights_after_loading; return model.eval(). Simplified: the model is not resolved
from an architecture but taken from the stand-in's ModelConfig.model_factory (a ready
nn.Module or a callable), and upstream's online-quantization (layerwise) branch is left out."""

from abc import ABC, abstractmethod

import torch
import torch.nn as nn

from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.utils import (initialize_model,
                                                    process_weights_after_loading,
                                                    set_default_torch_dtype)


class BaseModelLoader(ABC):
    """Base class for model loaders."""

    def __init__(self, load_config: LoadConfig):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config: ModelConfig) -> None:
        """Download a model so that it can be immediately loaded."""
        raise NotImplementedError

    @abstractmethod
    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Load weights into an already-initialized model."""
        raise NotImplementedError

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig,
                   prefix: str = "") -> nn.Module:
        device_config = vllm_config.device_config
        load_config = vllm_config.load_config
        load_device = (device_config.device if load_config.device is None
                       else load_config.device)
        target_device = torch.device(load_device)
        with set_default_torch_dtype(model_config.dtype):
            model = initialize_model(vllm_config=vllm_config, model_config=model_config,
                                     prefix=prefix, device=target_device)
            self.load_weights(model, model_config)
            process_weights_after_loading(model, model_config, target_device)
        return model.eval()
