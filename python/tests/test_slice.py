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
