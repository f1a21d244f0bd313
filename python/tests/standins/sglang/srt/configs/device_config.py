# Stand-in for python/sglang/srt/configs/device_config.py at sgl-project/sglang@569ae687f13132f05f7a7567ba0c66dad21fd2a2; only what kiln's loader touches.
"""DeviceConfig(device="cuda", gpu_id=-1): device becomes a torch.device of that type."""

import torch


class DeviceConfig:
    def __init__(self, device: str = "cuda", gpu_id: int = -1) -> None:
        if device not in ("cuda", "xpu", "hpu", "cpu", "npu"):
            raise RuntimeError(f"Not supported device type: {device}")
        self.device_type = device
        self.device = torch.device(device)
        self.gpu_id = gpu_id
