# SPDX-License-Identifier: MIT
"""Every golden case of the spec through the module: valid ones open, invalid ones raise."""

import numpy as np
import pytest

import kiln
from conftest import golden_bytes, golden_cases

CLASSES = {"FRAME": kiln.FrameError, "TYPE": kiln.FormatTypeError, "LIMIT": kiln.LimitError,
           "UTF8": kiln.UTF8Error}
SOURCES = ["mmap", "read", "uring"]


def test_manifest_has_every_case():
    assert len(golden_cases()) == 9


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name,length,expected", golden_cases())
def test_golden(write_bytes, name, length, expected, source):
    data = golden_bytes(name)
    assert len(data) == length
    path = write_bytes(data)
    if expected == "valid":
        with kiln.open(path, source=source, verify_payload=True) as d:
            info = d.info
            assert info["block_length"] == length
            assert info["source"] == source
            assert info["payload_verified"] is True
            assert len(d) == info["tensor_count"] == len(list(d))
            for i, t in enumerate(d):
                assert t.index == i
                assert t.address % 64 == 0
                raw = t.numpy(raw=True)
                assert raw.dtype == np.uint8 and raw.shape == (t.nbytes,)
                assert raw.tobytes() == data[t.file_offset:t.file_offset + t.nbytes]
    else:
        with pytest.raises(CLASSES[expected]) as e:
            kiln.open(path, source=source)
        assert e.value.cls == expected
        assert e.value.code == {"FRAME": 1, "TYPE": 2, "LIMIT": 3, "UTF8": 4}[expected]
        assert isinstance(e.value, kiln.FormatError) and isinstance(e.value, kiln.Error)


def test_f32_values(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-f32"))) as d:
        t = d[0]
        assert t.name is None and t.dtype == "f32" and t.shape == (2,) and t.nbytes == 8
        assert t.file_offset == 192 and t.byte_offset == 0
        assert d.keys() == []
        np.testing.assert_array_equal(t.numpy(), np.array([1.0, -2.0], np.float32))


def test_f16_named(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-f16-named"))) as d:
        assert d.keys() == ["w"] and "w" in d and "x" not in d
        np.testing.assert_array_equal(d["w"].numpy(), np.array([1.0], np.float16))
        assert d["w"].index == d[-1].index == 0


def test_scales_outer(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-scales-outer"))) as d:
        t = d[0]
        assert (t.dtype, t.quant_scheme, t.quant_axis, t.group_size) == ("e2m1", 2, 0, 16)
        assert t.scale.index == 1 and t.outer.index == 2
        assert d[1].scale is None and d[1].quant_axis is None
        assert d[2].file_offset == 576 and d[2].byte_offset == 128
        np.testing.assert_array_equal(t.outer.numpy(), np.array([1.0], np.float32))
        assert t.scale.numpy(raw=True).tolist() == [0x38]


def test_opaque(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-opaque"))) as d:
        t = d[0]
        assert t.dtype == "opaque" and t.dtype_code == 4096
        assert t.layout == "Q4_K" and t.block_size == 18 and t.shape == (32,)
        assert t.numpy(raw=True).tolist() == list(range(18))
        with pytest.raises(TypeError, match="opaque.*raw=True"):
            t.numpy()


def test_opaque_no_layout_detail(write_bytes):
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(write_bytes(golden_bytes("kiln-v2-opaque-no-layout")))
    assert e.value.tensor == 0 and e.value.field == "layout_off"
    assert e.value.offset is not None and e.value.errno is None


def test_f8_raw(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-f8-pair"))) as d:
        assert [t.numpy(raw=True).tolist() for t in d] == [[0x38], [0xC0]]
        with pytest.raises(TypeError, match="f8e4m3"):
            d[0].numpy()
        with pytest.raises(TypeError, match="f8e4m3"):
            d[0].__dlpack__()


def test_empty(write_bytes):
    with kiln.open(write_bytes(golden_bytes("kiln-v2-empty"))) as d:
        assert len(d) == 0 and list(d) == [] and d.keys() == []
        with pytest.raises(IndexError):
            d[0]
