# Stand-in for vllm/config/load.py at vllm-project/vllm@030eb6656cb22709afff2f689dc92c04939a5e07; only what kiln's loader touches.
"""LoadConfig with upstream's fields and defaults. Upstream is a pydantic dataclass that
validates types; this one only lower-cases load_format, as upstream's validator does.
``load_format`` is typed ``str | LoadFormats`` upstream: any string is accepted here and on
the command line, and get_model_loader decides whether a loader is registered for it."""

from dataclasses import dataclass, field


@dataclass
class LoadConfig:
    load_format: str = "auto"
    download_dir: str | None = None
    safetensors_load_strategy: str | None = None
    model_loader_extra_config: dict = field(default_factory=dict)
    device: str | None = None
    ignore_patterns: list[str] | str = field(default_factory=lambda: ["original/**/*"])
    use_tqdm_on_load: bool = True
    pt_load_map_location: str | dict[str, str] = "cpu"

    def __post_init__(self):
        if isinstance(self.load_format, str):
            self.load_format = self.load_format.lower()
