# SPDX-License-Identifier: MIT
"""kiln.patch_safetensors(): kiln's safetensors drop-in bound where libraries look for
safetensors, for runtimes that take no loader of their own (transformers, accelerate,
diffusers): ``sys.modules`` first, so that a later ``import safetensors`` gets kiln's, then the
names already-imported modules bound from the real package (``from safetensors import
safe_open`` copied the function into the importing module, where no sys.modules entry reaches
it)."""

import importlib
import sys

# Modules (and their submodules) whose bindings of safetensors' names are replaced: the ones
# that load checkpoints for these libraries. Others are left alone, so the patch reaches no
# further than it says.
_USERS = ("transformers", "accelerate", "diffusers")
_PARTS = ("safetensors", "safetensors.torch", "safetensors.numpy")


class Patch:
    """What patch_safetensors changed: ``modules`` (the sys.modules names bound to kiln's),
    ``bindings`` (``module.attr`` names rebound in libraries already imported). ``undo()`` puts
    back what was there (idempotent); also a context manager that undoes on exit."""

    def __init__(self):
        self.modules = []
        self.bindings = []
        self._saved_modules = {}  # name -> the module there before (None: there was none)
        self._saved_bindings = []  # (module, attr, the value before)
        self._undone = False

    def __repr__(self):
        return f"<kiln.Patch modules={self.modules} bindings={self.bindings}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def undo(self):
        if self._undone:
            return
        self._undone = True
        for module, attr, old in reversed(self._saved_bindings):
            setattr(module, attr, old)
        for name, old in self._saved_modules.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
            parent, _, child = name.rpartition(".")
            if parent and parent in sys.modules and old is not None:
                setattr(sys.modules[parent], child, old)


def _kiln_part(name):
    """kiln's module for safetensors part `name`, or None where it cannot be imported (the torch
    part without PyTorch)."""
    try:
        return importlib.import_module("kiln." + name)
    except ImportError:
        return None


def patch_safetensors():
    """Bind ``safetensors``, ``safetensors.torch`` and ``safetensors.numpy`` to kiln's drop-in
    (kiln.safetensors: the same API, any format kiln opens, every header byte checked), in
    ``sys.modules`` and in the already-imported modules of transformers, accelerate and
    diffusers (each attribute whose value is the real package's module, function or class is
    rebound to kiln's of the same name). Call it before the library loads a checkpoint; once
    is enough (a second call changes nothing and returns an empty Patch). Returns a Patch
    saying what changed, whose ``undo()`` restores it. ``safetensors.torch`` is bound only where
    PyTorch can be imported."""
    patch = Patch()
    replacement = {}  # id(real object) -> kiln's
    for name in _PARTS:
        ours = _kiln_part(name)
        if ours is None:
            continue
        old = sys.modules.get(name)
        if old is ours:
            continue
        if old is not None:
            replacement[id(old)] = ours
            for attr, value in vars(old).items():
                if attr.startswith("__"):
                    continue
                mine = getattr(ours, attr, None)
                if (mine is not None and mine is not value and callable(value)
                        and str(getattr(value, "__module__", "")).startswith("safetensors")):
                    replacement[id(value)] = mine
        patch._saved_modules[name] = old
        sys.modules[name] = ours
        patch.modules.append(name)
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules:
            # `import safetensors.torch` then `safetensors.torch.load_file` goes through the
            # parent's attribute.
            setattr(sys.modules[parent], child, ours)
    if replacement:
        for mod_name, module in list(sys.modules.items()):
            if module is None or not mod_name.split(".", 1)[0] in _USERS:
                continue
            for attr, value in list(vars(module).items()):
                mine = replacement.get(id(value))
                if mine is not None:
                    patch._saved_bindings.append((module, attr, value))
                    setattr(module, attr, mine)
                    patch.bindings.append(f"{mod_name}.{attr}")
    return patch
