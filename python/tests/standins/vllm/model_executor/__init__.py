# Stand-in for vllm/model_executor/__init__.py at vllm-project/vllm@a6cdfc38df34a67205ce86af8b9fc7a420824bf8; only what kiln's loader touches.
"""Package marker; upstream's parameter re-exports are not mirrored."""
