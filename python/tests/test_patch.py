# SPDX-License-Identifier: MIT
"""kiln.patch_safetensors(): kiln's drop-in bound in sys.modules and in modules that did
`from safetensors import safe_open` before the patch, replayed with transformers' and
accelerate's exact call sequences; undo puts everything back. transformers, accelerate and the
real safetensors cannot be installed here: small stand-ins play them (a "real" safetensors whose
every function says it is not kiln's), in a child process so this one's modules stay clean."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")

FILES = {
    # The package being replaced.
    "safetensors/__init__.py": """
        class SafetensorError(Exception):
            pass
        def safe_open(*a, **k):
            raise RuntimeError("the real safetensors was called")
    """,
    "safetensors/torch.py": """
        def load_file(*a, **k):
            raise RuntimeError("the real safetensors.torch was called")
        def save_file(*a, **k):
            raise RuntimeError("the real safetensors.torch was called")
    """,
    "safetensors/numpy.py": """
        def load_file(*a, **k):
            raise RuntimeError("the real safetensors.numpy was called")
    """,
    # transformers' modeling_utils binds the names at import (4.4x).
    "transformers/__init__.py": "",
    "transformers/modeling_utils.py": """
        from safetensors import safe_open
        from safetensors.torch import load_file as safe_load_file
    """,
    # accelerate.utils.modeling the same way.
    "accelerate/__init__.py": "",
    "accelerate/utils/__init__.py": "",
    "accelerate/utils/modeling.py": """
        from safetensors import safe_open
        from safetensors.torch import load_file as safe_load_file
    """,
    # diffusers goes through the package attribute.
    "diffusers/__init__.py": "",
    "diffusers/models/__init__.py": "",
    "diffusers/models/model_loading_utils.py": """
        import safetensors
        import safetensors.torch
        def load_state_dict(f):
            return safetensors.torch.load_file(f, device="cpu")
    """,
    # A module of no listed library: left alone.
    "other.py": "from safetensors import safe_open",
}

SCRIPT = """
import sys, torch, json
import transformers.modeling_utils as mu, accelerate.utils.modeling as am
import diffusers.models.model_loading_utils as dm
import other
import kiln, kiln.safetensors, kiln.safetensors.torch
real_open = mu.safe_open
path = sys.argv[1]
want = {"a": torch.arange(24, dtype=torch.float32).reshape(4, 6),
        "b": torch.arange(5, dtype=torch.int64)}
kiln.safetensors.torch.save_file(want, path, metadata={"format": "pt"})

patch = kiln.patch_safetensors()
out = {"modules": patch.modules, "bindings": sorted(patch.bindings),
       "again": repr(kiln.patch_safetensors())}
import safetensors
out["imported_after"] = safetensors is kiln.safetensors

# transformers' sequence: safe_open without `with`, keys, metadata, get_slice, [...],
# get_dtype/get_shape, a row and a column slice, then __exit__.
f = mu.safe_open(path, framework="pt", device="cpu")
assert f.metadata() == {"format": "pt"}
for k in f.keys():
    sl = f.get_slice(k)
    full = sl[...]
    assert torch.equal(full, want[k]), k
    assert sl.get_dtype() == {"a": "F32", "b": "I64"}[k] and sl.get_shape() == list(want[k].shape)
    if k == "a":
        assert torch.equal(sl[1:3], want[k][1:3]) and torch.equal(sl[:, 2:5], want[k][:, 2:5])
f.__exit__(None, None, None)
# accelerate's: load_file(f, device="cpu").
sd = am.safe_load_file(path, device="cpu")
assert set(sd) == {"a", "b"} and all(torch.equal(sd[k], want[k]) for k in sd)
sd = dm.load_state_dict(path)
assert all(torch.equal(sd[k], want[k]) for k in sd)
out["other_left_alone"] = other.safe_open is real_open

patch.undo()
patch.undo()  # idempotent
out["undone"] = (mu.safe_open is real_open and sys.modules["safetensors"].__name__ ==
                 "safetensors" and "kiln" not in sys.modules["safetensors.torch"].__file__
                 and "kiln" not in repr(am.safe_load_file.__module__))
try:
    mu.safe_open(path, framework="pt")
except RuntimeError as e:
    out["after_undo"] = str(e)
print(json.dumps(out))
"""


def test_patch_replays_transformers_and_accelerate(tmp_path):
    root = tmp_path / "site"
    for name, text in FILES.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    (tmp_path / "run.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + [x for x in sys.path if x])
    r = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "m.st")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["modules"] == ["safetensors", "safetensors.torch", "safetensors.numpy"]
    assert out["bindings"] == [
        "accelerate.utils.modeling.safe_load_file", "accelerate.utils.modeling.safe_open",
        "diffusers.models.model_loading_utils.safetensors",
        "transformers.modeling_utils.safe_load_file", "transformers.modeling_utils.safe_open"]
    assert out["again"] == "<kiln.Patch modules=[] bindings=[]>"
    assert out["imported_after"] and out["other_left_alone"] and out["undone"]
    assert out["after_undo"] == "the real safetensors was called"


def test_patch_without_safetensors_installed_binds_sys_modules(tmp_path):
    script = textwrap.dedent("""
        import sys, kiln
        assert "safetensors" not in sys.modules
        p = kiln.patch_safetensors()
        import safetensors.torch
        from safetensors import safe_open
        assert safe_open is kiln.safetensors.safe_open
        assert safetensors.torch.load_file is kiln.safetensors.torch.load_file
        p.undo()
        assert "safetensors" not in sys.modules and "safetensors.torch" not in sys.modules
        print(p.modules, p.bindings)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           x for x in sys.path if x)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['safetensors', 'safetensors.torch', 'safetensors.numpy'] []"
