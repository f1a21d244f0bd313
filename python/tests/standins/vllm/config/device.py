# Stand-in for vllm/config/device.py at vllm-project/vllm@a545f8a63521a55a1118112123d26ce3dbebb41d; only what kiln's loader touches.
"""DeviceConfig: ``device`` becomes a torch.device; "auto" asks the platform upstream, here
it is cuda when torch sees a GPU, else cpu."""

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DeviceConfig:
    device: Any = "auto"
    device_type: str = field(init=False)

    def __post_init__(self):
        if self.device == "auto":
            self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        elif isinstance(self.device, torch.device):
            self.device_type = self.device.type
        else:
            self.device_type = str(self.device)
        self.device = torch.device(self.device_type)
