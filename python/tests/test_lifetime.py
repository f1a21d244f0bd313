# SPDX-License-Identifier: MIT
"""Arrays keep the mapping: close, leave the with block, del and gc, then use them safely.
And once the last one is gone, the file is unmapped (nothing leaks)."""

import gc

import numpy as np
import pytest

import kiln

DATA = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.arange(5, dtype=np.int64)}


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "life.klnt")
    kiln.save_file(DATA, p)
    return p


def mapped(path):
    with open("/proc/self/maps") as f:
        return path in f.read()


@pytest.mark.parametrize("source", ["mmap", "read", "uring"])
def test_close_then_use(path, source):
    d = kiln.open(path, source=source)
    w, b, t = d["w"].numpy(), d["b"].numpy(raw=True), d["w"]
    d.close()
    assert d.closed
    with pytest.raises(ValueError, match="closed"):
        len(d)
    with pytest.raises(ValueError, match="closed"):
        d["w"]
    gc.collect()
    np.testing.assert_array_equal(w, DATA["w"])
    assert b.tobytes() == DATA["b"].tobytes()
    np.testing.assert_array_equal(t.numpy(), DATA["w"])  # a view outlives the Dir too
    d.close()  # twice is fine


def test_with_block_and_del(path):
    with kiln.safe_open(path, "np") as f:
        w = f.get_tensor("w")
        s = f.get_slice("w")[::3, 5:1:-1]
    del f
    gc.collect()
    np.testing.assert_array_equal(w, DATA["w"])
    np.testing.assert_array_equal(s, DATA["w"][::3, 5:1:-1])
    arrays = kiln.load_file(path)
    gc.collect()
    np.testing.assert_array_equal(arrays["b"], DATA["b"])


def test_unmapped_after_last_array(path):
    d = kiln.open(path)
    assert mapped(path)
    w = d["w"].numpy()
    view = w[10:20]
    del d
    gc.collect()
    assert mapped(path)
    del w
    gc.collect()
    assert mapped(path)  # `view` still holds it through its base
    np.testing.assert_array_equal(view, DATA["w"][10:20])
    del view
    gc.collect()
    assert not mapped(path)


def test_dlpack_capsule_keeps_mapping(path):
    d = kiln.open(path)
    cap = d["w"].__dlpack__()
    unused = d["b"].to_dlpack(raw=True)
    d.close()
    gc.collect()
    assert mapped(path)
    del cap, unused  # capsules never consumed free their tensors and drop their references
    gc.collect()
    assert not mapped(path)


def test_from_dlpack_after_close(path):
    d = kiln.open(path)
    t = d["w"]
    d.close()
    arr = np.from_dlpack(t)
    del t
    gc.collect()
    assert mapped(path)
    np.testing.assert_array_equal(arr, DATA["w"])
    del arr
    gc.collect()
    assert not mapped(path)
