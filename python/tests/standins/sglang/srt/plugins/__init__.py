# Stand-in for python/sglang/srt/plugins/__init__.py at sgl-project/sglang@32c764af5f16beac1afaf71d2d6fcf39a064f304; only what kiln's loader touches.
"""SGLang's general plugins: callables a distribution names under the entry-point group
``sglang.srt.plugins``. load_plugins() runs once per process: it loads and calls each
(``SGLANG_PLUGINS``, comma-separated, keeps only the names it lists; a failure to load or to
run a plugin is logged, not raised), then applies the hooks they registered
(HookRegistry.apply_hooks). Left out: the ``sglang.srt.platforms`` group and the
SGLANG_PLATFORM exclusion of unselected platform distributions; the source attribution of
hooks."""

import logging
import os
from importlib.metadata import entry_points

from sglang.srt.plugins.hook_registry import HookRegistry

logger = logging.getLogger(__name__)

PLATFORM_PLUGINS_GROUP = "sglang.srt.platforms"
GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"

_plugins_loaded = False


def load_plugins_by_group(group: str) -> dict:
    """{name: (the loaded callable, its distribution's name or None)}."""
    allowed = None
    if os.environ.get("SGLANG_PLUGINS"):
        allowed = {x.strip() for x in os.environ["SGLANG_PLUGINS"].split(",") if x.strip()}
    plugins = {}
    for ep in entry_points(group=group):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            plugins[ep.name] = (ep.load(), ep.dist.name if ep.dist else None)
        except Exception:
            logger.exception("Failed to load plugin %s from group %s", ep.name, group)
    return plugins


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name, (func, _dist) in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items():
        try:
            func()
        except Exception:
            logger.exception("Failed to execute general plugin: %s", name)
    HookRegistry.apply_hooks()
