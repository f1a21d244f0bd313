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
    """(anonymous, file-backed) resident KiB of this process, from /proc/self/status."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                got[key] = int(value.split()[0])
    return got["RssAnon"], got["RssFile"]


def sparse_u8(path, n):
    """A file of one u8 tensor "big" of n zero bytes, written as a hole: a 64-byte tensor's
    file with its shape, byte_length (descriptor 0, offsets 48 and 40) and the header's
    payload_bytes (offset 16) patched, then extended (written without a digest table, so that
    the tensor ends the file). No disk is spent on the zeros."""
    import struct

    kiln.write_file(path, [("big", "u8", (64,), bytes(64))], digests=False)  # last: "big"
    with open(path, "r+b") as f:
        base = f.seek(0, 2) - 64
        for off in (16, 64 + 40, 64 + 48):
            f.seek(off)
            f.write(struct.pack("<Q", n))
        f.truncate(base + n)
    with kiln.open(path) as d:
        assert d["big"].nbytes == n


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_no_rss_growth(tmp_path, framework):
    """Getting a 256 MiB tensor reads and copies nothing: anonymous memory does not grow (no
    copy, and the copy-on-write mapping copies nothing unwritten), nor do file pages (get does
    not touch the mapping). Reading the tensor then faults file pages in, never anonymous
    ones. File pages are charged only when touched, so the page cache does not count."""
    if framework == "pt":
        torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    n = 256 << 20
    p = str(tmp_path / "big.klnt")
    sparse_u8(p, n)
    import gc

    gc.collect()
    anon0, file0 = rss_kib()
    with kiln.safe_open(p, framework) as f:
        arr = f.get_tensor("big")
        again = f.get_tensor("big")
    anon1, file1 = rss_kib()
    assert anon1 - anon0 < 2048, f"anonymous RSS grew by {anon1 - anon0} KiB getting 256 MiB"
    assert file1 - file0 < 2048, f"file RSS grew by {file1 - file0} KiB: get touched pages"
    if framework == "np":
        assert arr.nbytes == n and np.shares_memory(arr, again)
        total = int(arr.sum(dtype=np.uint64))
    else:
        assert arr.numel() == n and arr.data_ptr() == again.data_ptr()
        total = int(arr.sum(dtype=torch.int64))
    assert total == 0
    anon2, file2 = rss_kib()
    assert anon2 - anon0 < 2048, f"reading the tensor grew anonymous RSS by {anon2 - anon0} KiB"
    # Reading faulted the file's pages in (unless the kernel keeps none resident: not expected).
    assert file2 - file0 > (n >> 10) // 2, f"file RSS grew by only {file2 - file0} KiB"


def test_dlpack_protocol_keywords(path):
    with kiln.open(path) as d:
        t = d["a"]
        assert t.__dlpack_device__() == (1, 0)
        for kw in ({}, {"stream": None}, {"max_version": (1, 0)}, {"dl_device": (1, 0)},
                   {"dl_device": [1, 0]}, {"copy": False}, {"copy": None}):
            np.testing.assert_array_equal(np.from_dlpack(_Exporter(t, kw)), t.numpy())
        with pytest.raises(BufferError, match="copy"):
            t.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="CPU"):
            t.__dlpack__(dl_device=(2, 0))
        with pytest.raises(TypeError):
            t.__dlpack__(colour=1)
        with pytest.raises(TypeError, match="pair"):
            t.__dlpack__(dl_device=1)


class _Exporter:
    """Calls kiln's __dlpack__ with the given keywords, as a newer consumer would."""

    def __init__(self, t, kw):
        self.t, self.kw = t, kw

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(**self.kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()
