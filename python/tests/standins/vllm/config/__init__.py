# Stand-in for vllm/config/__init__.py at vllm-project/vllm@a4cd9d0d28bdb41db8dfe0acdafac2bf2f608630; only what kiln's loader touches.
"""As upstream, the config classes are defined in their own modules and re-exported here."""

from vllm.config.device import DeviceConfig
from vllm.config.load import LoadConfig
from vllm.config.model import ModelConfig
from vllm.config.vllm import VllmConfig

__all__ = ["DeviceConfig", "LoadConfig", "ModelConfig", "VllmConfig"]
