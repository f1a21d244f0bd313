# Stand-in for python/sglang/srt/configs/load_config.py at sgl-project/sglang@0087fccb64de2209907cee4828e741ca88165bb6; only what kiln's loader touches.
"""LoadFormat and LoadConfig. As upstream: a string load_format is lower-cased and turned into
a LoadFormat member, so a name SGLang does not know raises ValueError ("'x' is not a valid
LoadFormat"); a load_format that is not a string (a loader class) is kept as it is; a JSON
string model_loader_extra_config is parsed to a dict; ignore_patterns defaults to
["original/**/*"]. Members are those at the cited commit (later commits add more: REMOTE_INSTANCE,
FLASH_RL, RDMA, LOCAL_CACHED, FASTSAFETENSORS, PRIVATE, RUNAI_STREAMER, ...)."""

import enum
import json
from dataclasses import dataclass, field
from typing import List, Optional, Union


class LoadFormat(str, enum.Enum):
    AUTO = "auto"
    PT = "pt"
    SAFETENSORS = "safetensors"
    NPCACHE = "npcache"
    DUMMY = "dummy"
    SHARDED_STATE = "sharded_state"
    GGUF = "gguf"
    BITSANDBYTES = "bitsandbytes"
    MISTRAL = "mistral"
    LAYERED = "layered"
    REMOTE = "remote"


@dataclass
class LoadConfig:
    load_format: Union[str, LoadFormat, type] = LoadFormat.AUTO
    download_dir: Optional[str] = None
    model_loader_extra_config: Optional[Union[str, dict]] = field(default_factory=dict)
    ignore_patterns: Optional[Union[List[str], str]] = None

    def __post_init__(self):
        extra = self.model_loader_extra_config or {}
        self.model_loader_extra_config = json.loads(extra) if isinstance(extra, str) else extra
        if isinstance(self.load_format, str):
            self.load_format = LoadFormat(self.load_format.lower())
        if not self.ignore_patterns:
            self.ignore_patterns = ["original/**/*"]
