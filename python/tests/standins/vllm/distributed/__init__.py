# Stand-in for vllm/distributed/__init__.py at vllm-project/vllm@13a891d8e9f1858ea60c91d3cbb882d970d7589c; only what kiln's loader touches.
"""As upstream, the parallel-state names are re-exported from the package."""

from vllm.distributed.parallel_state import *  # noqa: F401,F403
