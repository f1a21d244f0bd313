# Stand-in for python/sglang/srt/plugins/hook_registry.py at sgl-project/sglang@106f37cea63a70dea91958cb633ccbd87c932d40; only what kiln's loader touches.
"""HookRegistry: a plugin registers a hook on a dotted target ("module.attr" or
"module.Class.method"); apply_hooks() patches the target once. Hook kinds as upstream:
BEFORE fn(*a, **kw) -> (a, kw) or None; AFTER fn(result, *a, **kw) -> new result or None;
AROUND fn(original, *a, **kw); REPLACE a function or a class (classes only with REPLACE).
Left out: re-binding other modules' ``from X import name`` copies (upstream walks sys.modules),
classmethod/staticmethod preservation, and the conflict warnings."""

import enum
import functools
import logging
import pkgutil
from collections import defaultdict

logger = logging.getLogger(__name__)


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


def _wrap(original, hook, kind):
    if kind is HookType.REPLACE:
        if isinstance(hook, type):
            return hook
        call = lambda *a, **kw: hook(*a, **kw)  # noqa: E731
    elif kind is HookType.BEFORE:
        def call(*a, **kw):
            changed = hook(*a, **kw)
            if changed is not None:
                a, kw = changed
            return original(*a, **kw)
    elif kind is HookType.AFTER:
        def call(*a, **kw):
            result = original(*a, **kw)
            new = hook(result, *a, **kw)
            return result if new is None else new
    else:
        call = lambda *a, **kw: hook(original, *a, **kw)  # noqa: E731
    wrapper = functools.wraps(original)(call)
    wrapper.__wrapped__ = original
    return wrapper


class HookRegistry:
    _hooks = defaultdict(list)
    _patched = set()

    @classmethod
    def register(cls, target: str, hook, hook_type: HookType = HookType.AFTER):
        if isinstance(hook, type) and hook_type is not HookType.REPLACE:
            raise TypeError(f"Class {hook.__name__} can only be used with HookType.REPLACE")
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in sorted(cls._hooks.items()):
            if target in cls._patched:
                continue
            try:
                owner_path, attr = target.rsplit(".", 1)
                owner = pkgutil.resolve_name(owner_path)
                wrapped = getattr(owner, attr)
                # REPLACE first, then the others wrap the replacement (upstream's order)
                for kind, hook in sorted(hooks, key=lambda h: h[0] is not HookType.REPLACE):
                    wrapped = _wrap(wrapped, hook, kind)
                setattr(owner, attr, wrapped)
                cls._patched.add(target)
            except Exception:  # as upstream: logged, the other targets still applied
                logger.exception("Failed to apply hooks to %s", target)

    @classmethod
    def reset(cls):
        cls._hooks.clear()
        cls._patched.clear()


def plugin_hook(target: str, type: HookType = HookType.AFTER):
    """Decorator form of HookRegistry.register."""
    def deco(fn):
        HookRegistry.register(target, fn, type)
        return fn
    return deco
