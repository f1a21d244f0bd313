# Stand-in for vllm/plugins/__init__.py at vllm-project/vllm@01425553bdbed63400efa72ff14a8f4ffe20bada; only what kiln's loader touches.
"""General plugins: the callables a distribution names under the entry-point group
``vllm.general_plugins``, each called once per process. As upstream: ``VLLM_PLUGINS``
(comma-separated names), when set, keeps only the plugins it names; a plugin that fails to
import is logged and skipped; an exception raised by the plugin's function propagates.
Left out: upstream's platform set-up (XPU dynamo switch) before the plugins run."""

import logging
import os
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"

# as upstream: one process loads the plugins once (tests may reset this to False)
plugins_loaded = False


def _allowed_plugins():
    # upstream: vllm.envs.VLLM_PLUGINS, None when unset, else the value split on ","
    value = os.environ.get("VLLM_PLUGINS")
    return None if value is None else value.split(",")


def load_plugins_by_group(group: str) -> dict:
    """{name: the loaded callable} for the entry points of ``group``."""
    allowed = _allowed_plugins()
    found = entry_points(group=group)
    if len(found) == 0:
        logger.debug("No plugins for group %s found.", group)
        return {}
    plugins = {}
    for ep in found:
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            plugins[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s", ep.name)
    return plugins


def load_general_plugins():
    """Call every general plugin, once per process."""
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP).values():
        func()
