# Stand-in for python/sglang/srt/configs/__init__.py at sgl-project/sglang@a2fbcda96ce3c91264706e255c94f60862e96de7; only what kiln's loader touches.
"""Package marker; upstream's re-exports of model-specific HF configs are not mirrored."""
