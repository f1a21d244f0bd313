# Stand-in for python/sglang/srt/__init__.py at sgl-project/sglang@4632493515f269ad6749a13abe1b28fa3ae6d710; only what kiln's loader touches.
"""Package marker. The stored index holds no python/sglang/srt/__init__.py for sgl-project/sglang
(upstream sglang.srt is imported as a namespace package); this file only makes the stand-in
a regular package."""
