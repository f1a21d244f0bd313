# SPDX-License-Identifier: MIT
"""Arrays view the file's bytes: shared, aligned, read-only, and no memory grows getting one."""

import numpy as np
import pytest

import kiln


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "z.klnt")
    kiln.save_file({"a": np.arange(1000, dtype=np.float32), "b": np.arange(7, dtype=np.int8),
                    "c": np.arange(12, dtype=np.float64).reshape(3, 4)}, p)
    return p


@pytest.mark.parametrize("source", ["mmap", "read", "uring"])
def test_shared_aligned_read_only(path, source):
    with kiln.open(path, source=source) as d:
        for t in d:
            x, y = t.numpy(), d[t.name].numpy()
            assert np.shares_memory(x, y)
            assert x.ctypes.data == y.ctypes.data == t.address
            assert x.ctypes.data % 64 == 0
            assert not x.flags.writeable and x.flags.c_contiguous
            with pytest.raises(ValueError):
                x[...] = 0
            with pytest.raises(ValueError):
                x.flags.writeable = True
            assert np.shares_memory(x, t.numpy(raw=True))
            assert np.shares_memory(x, np.from_dlpack(t))


def test_safe_open_gets_share(path):
    with kiln.safe_open(path, "np") as f:
        assert np.shares_memory(f.get_tensor("a"), f.get_tensor("a"))
        assert np.shares_memory(f.get_tensor("c"), f.get_slice("c")[1:, ::2])


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


def test_no_rss_growth(tmp_path):
    # 64 MiB, not 256, to spare the shared CI disk; the point is that nothing is read or copied.
    n = 64 << 20
    p = str(tmp_path / "big.klnt")
    kiln.save_file({"big": np.zeros(n, np.uint8)}, p)
    before = rss_kib()
    with kiln.safe_open(p, "np") as f:
        arr = f.get_tensor("big")
        again = f.get_tensor("big")
    grown = rss_kib() - before
    assert arr.nbytes == n and np.shares_memory(arr, again)
    assert grown < 4096, f"RSS grew by {grown} KiB getting a {n >> 20} MiB tensor"
    assert arr[n // 2] == 0 and arr[-1] == 0


def test_dlpack_protocol_keywords(path):
    with kiln.open(path) as d:
        t = d["a"]
        assert t.__dlpack_device__() == (1, 0)
        for kw in ({}, {"stream": None}, {"max_version": (1, 0)}, {"dl_device": (1, 0)},
                   {"copy": False}, {"copy": None}):
            np.testing.assert_array_equal(np.from_dlpack(_Exporter(t, kw)), t.numpy())
        with pytest.raises(BufferError, match="copy"):
            t.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="CPU"):
            t.__dlpack__(dl_device=(2, 0))
        with pytest.raises(TypeError):
            t.__dlpack__(colour=1)


class _Exporter:
    """Calls kiln's __dlpack__ with the given keywords, as a newer consumer would."""

    def __init__(self, t, kw):
        self.t, self.kw = t, kw

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(**self.kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()
