# SPDX-License-Identifier: MIT
"""get_slice on every axis, with every kind of step, against numpy slicing of a full copy."""

import itertools

import numpy as np
import pytest

import kiln

FULL = np.arange(5 * 6 * 7, dtype=np.int32).reshape(5, 6, 7)
SLICES = [slice(None), slice(1, 4), slice(None, None, 2), slice(4, 0, -1), slice(None, None, -3),
          slice(-3, None), slice(2, 2), slice(10, 20), slice(-100, 100, 4), slice(3, 1)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("slice") / "s.klnt")
    kiln.save_file({"x": FULL, "v": FULL[0, 0]}, p)
    return p


@pytest.mark.parametrize("axis", range(3))
@pytest.mark.parametrize("sl", SLICES, ids=str)
def test_one_axis(path, axis, sl):
    key = tuple(sl if i == axis else slice(None) for i in range(3))
    copy = np.array(FULL)
    with kiln.safe_open(path, "np") as f:
        s = f.get_slice("x")
        assert s.get_shape() == [5, 6, 7] and s.get_dtype() == "i32"
        got = s[key]
    np.testing.assert_array_equal(got, copy[key])
    assert got.shape == copy[key].shape


def test_axes_combined_and_ints(path):
    copy = np.array(FULL)
    with kiln.safe_open(path, "np") as f:
        s = f.get_slice("x")
        for a, b, c in itertools.product(SLICES[:5], SLICES[2:7], SLICES[::3]):
            np.testing.assert_array_equal(s[a, b, c], copy[a, b, c])
        np.testing.assert_array_equal(s[2], copy[2])
        np.testing.assert_array_equal(s[-1, ..., 3], copy[-1, ..., 3])
        np.testing.assert_array_equal(s[1:3], copy[1:3])
        np.testing.assert_array_equal(f.get_slice("v")[:3], FULL[0, 0, :3])
        with pytest.raises(IndexError):
            s[5]


@pytest.mark.parametrize("directory_only", [False, True])
def test_read_slices(path, directory_only):
    # Dir.read_slices: contiguous slices of one axis each, in one queue, on any open.
    with kiln.open(path, directory_only=directory_only) as d:
        bufs = [np.zeros((5, 2, 7), np.int32), np.zeros((2, 6, 7), np.int32),
                np.zeros((5, 6, 3), np.int32), np.zeros(0, np.int32)]
        n = d.read_slices([(d["x"], 1, 3, 5, bufs[0]), ("x", 0, 3, 5, bufs[1]),
                           ("x", 2, 4, 7, bufs[2]), ("v", 0, 3, 3, bufs[3])])
        assert n == sum(b.nbytes for b in bufs)
        np.testing.assert_array_equal(bufs[0], FULL[:, 3:5])
        np.testing.assert_array_equal(bufs[1], FULL[3:5])
        np.testing.assert_array_equal(bufs[2], FULL[:, :, 4:7])
        with pytest.raises(kiln.Error, match="axis"):
            d.read_slices([("x", 3, 0, 1, bufs[0])])
        with pytest.raises(kiln.Error):
            d.read_slices([("x", 0, 4, 9, bufs[1])])  # past the axis's end
        with pytest.raises(ValueError, match="cannot hold the slice"):
            d.read_slices([("x", 1, 0, 6, bufs[0])])
        with pytest.raises(TypeError, match="item 0"):
            d.read_slices([("x", 1, 3)])
        for item in (("x", 0, -1, 2), ("x", -1, 0, 2), ("x", 0, 0, -1)):
            with pytest.raises(ValueError, match="item 0: axis, start and stop must be 0"):
                d.read_slices([item + (bufs[1],)])
        with pytest.raises(KeyError):
            d.read_slices([("nope", 0, 0, 1, bufs[0])])


def test_directory_only_views_have_no_bytes(path):
    with kiln.open(path, directory_only=True) as d:
        t = d["x"]
        assert t.shape == (5, 6, 7) and t.address == 0
        with pytest.raises(ValueError, match="directory-only.*numpy"):
            t.numpy()
        with pytest.raises(ValueError, match="directory-only.*DLPack"):
            t.__dlpack__()
        np.testing.assert_array_equal(t.copy(), FULL)  # read through the source
        out = np.zeros_like(FULL)
        assert t.read_into(out) == FULL.nbytes
        np.testing.assert_array_equal(out, FULL)
