# Stand-in for vllm/model_executor/model_loader/weight_utils.py at vllm-project/vllm@0a1ee72ed53f07ca8e57e5e82fdbd89734b39026; only what kiln's loader touches.
"""download_weights_from_hf with upstream's signature. Upstream snapshot-downloads the files
matching ``allow_patterns`` (the first pattern that matches anything on the Hub) into
``cache_dir`` and returns the snapshot folder; the stand-in has no network and refuses."""


class StandInNoNetwork(RuntimeError):
    """Raised where upstream would reach the Hugging Face Hub."""


def download_weights_from_hf(
    model_name_or_path: str,
    cache_dir: str | None,
    allow_patterns: list[str],
    revision: str | None = None,
    ignore_patterns: str | list[str] | None = None,
) -> str:
    raise StandInNoNetwork(
        f"vLLM stand-in: download_weights_from_hf({model_name_or_path!r}, "
        f"allow_patterns={allow_patterns!r}, revision={revision!r}) would download from the "
        "Hugging Face Hub; the stand-in has no network. Use a local model directory, or "
        "monkeypatch this function in the test.")
