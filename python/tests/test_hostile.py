# SPDX-License-Identifier: MIT
"""Damaged files through the module: every one opens or raises a kiln.FormatError, and a file
that opens gives consistent views and copies. Nothing crashes."""

import random

import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    p = tmp_path_factory.mktemp("hostile") / "seed.klnt"
    kiln.save_file({"w": np.arange(40, dtype=np.float32).reshape(5, 8),
                    "name with spaces \u00e9": np.arange(3, dtype=np.int8),
                    "s": np.array(7, np.uint64), "z": np.zeros((0, 3), np.float16)}, str(p))
    return p.read_bytes()


def mutations(data, seed):
    rng = random.Random(seed)
    directory_bytes = int.from_bytes(data[24:32], "little")
    payload_base = (64 + directory_bytes + 63) // 64 * 64
    out = bytearray(data)
    kind = seed % 4
    if kind == 3:
        return bytes(out[:rng.randrange(len(out))])
    for _ in range(rng.randint(1, 4)):
        # The header and directory, where every byte has a rule, and the payloads.
        i = rng.randrange(payload_base if rng.random() < 0.6 else len(out))
        out[i] = rng.randrange(256) if kind != 1 else out[i] ^ (1 << rng.randrange(8))
    return bytes(out)


@pytest.mark.parametrize("source", ["mmap", "read", "uring"])
def test_mutations(tmp_path, block, source):
    path = str(tmp_path / "m.klnt")
    opened = rejected = 0
    for seed in range(150):
        data = mutations(block, seed)
        with open(path, "wb") as f:
            f.write(data)
        try:
            d = kiln.open(path, source=source)
        except kiln.FormatError as e:
            assert e.cls in ("FRAME", "TYPE", "LIMIT", "UTF8")
            rejected += 1
            continue
        opened += 1
        with d:
            for t in d:
                raw = t.numpy(raw=True)
                assert raw.tobytes() == data[t.file_offset:t.file_offset + t.nbytes]
                assert t.copy(raw=True).tobytes() == raw.tobytes()
                assert t.address % 64 == 0
                try:
                    t.numpy()
                except TypeError as e:
                    assert t.dtype in str(e) or "opaque" in str(e)
            try:
                d.verify_payload()
            except kiln.FormatTypeError:
                pass
    assert rejected > 0 and opened > 0 and opened + rejected == 150, (opened, rejected)
