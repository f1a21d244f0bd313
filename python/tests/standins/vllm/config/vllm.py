# Stand-in for vllm/config/vllm.py at vllm-project/vllm@09f030eaf851400a83ad3d99f730868f76df0ca7; only what kiln's loader touches.
"""VllmConfig with the members BaseModelLoader.load_model reads."""

from dataclasses import dataclass, field
from typing import Any

from vllm.config.device import DeviceConfig
from vllm.config.load import LoadConfig
from vllm.config.model import ModelConfig


@dataclass
class VllmConfig:
    model_config: ModelConfig | None = None
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    quant_config: Any = None
