# SPDX-License-Identifier: MIT
"""Shared helpers for the kiln module's tests (run by ctest as the `python` test)."""

import importlib.util
import os
import pathlib
import sys

import pytest

# `/usr/bin/python3 -m pytest python/tests` from the source tree: when no kiln is importable
# (ctest sets PYTHONPATH; an install puts it in dist-packages), use the default build directory.
if importlib.util.find_spec("kiln") is None:
    _built = pathlib.Path(__file__).resolve().parents[2] / "build" / "python"
    if (_built / "kiln").is_dir():
        sys.path.insert(0, str(_built))

GOLDEN = pathlib.Path(
    os.environ.get("KILN_GOLDEN_DIR", pathlib.Path(__file__).resolve().parents[2] / "golden"))


def hex_decode(text):
    """Decode a golden .hex file as tests/helpers.c does: hex pairs, '#' comments to line end."""
    digits = "".join(line.split("#", 1)[0] for line in text.splitlines())
    digits = "".join(digits.split())
    assert len(digits) % 2 == 0, "odd number of hex digits"
    return bytes.fromhex(digits)


def golden_cases():
    """(name, length, expected) for each MANIFEST line."""
    cases = []
    for line in (GOLDEN / "MANIFEST").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, length, expected = line.split()
        cases.append((name, int(length), expected))
    return cases


def golden_bytes(name):
    return hex_decode((GOLDEN / f"{name}.hex").read_text())


def flip_bit(path, at):
    """Flip the lowest bit of byte `at` of the file (twice puts it back)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


def klnt_cli():
    """The klnt CLI's path (KILN_KLNT, else build/klnt); the test is skipped without one."""
    k = os.environ.get("KILN_KLNT") or str(
        pathlib.Path(__file__).resolve().parents[2] / "build" / "klnt")
    if not os.path.exists(k):
        pytest.skip(f"the klnt CLI is not built ({k}; KILN_KLNT names it)")
    return k


def klnt_env():
    """The environment to run klnt in: it links its own sanitizer runtime (if any), not the one
    preloaded into Python."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@pytest.fixture
def write_bytes(tmp_path):
    """Write bytes to a fresh file and return its path."""
    counter = [0]

    def write(data, name=None):
        counter[0] += 1
        p = tmp_path / (name or f"f{counter[0]}.klnt")
        p.write_bytes(data)
        return str(p)

    return write
