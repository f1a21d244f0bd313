# Stand-in for python/sglang/__init__.py at sgl-project/sglang@1322caec33f28c34ed2c6b7d3f4b7a9747e21300; only what kiln's loader touches.
"""A stand-in for the sglang package, for contract tests without SGLang installed. Nothing of
upstream's top level (Engine, the frontend language) is here; see tests/standins/README.md."""

__version__ = "0.0.0+standin"
STANDIN = True
