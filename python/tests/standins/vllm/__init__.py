# Stand-in for vllm/__init__.py at vllm-project/vllm@4cea4997b4b2e540fc137e7f0beaee1a94649993; only what kiln's loader touches.
"""A stand-in for the vllm package, for contract tests without vLLM installed. Nothing of
upstream's top level (LLM, SamplingParams, ...) is here; see tests/standins/README.md."""

__version__ = "0.0.0+standin"
STANDIN = True
