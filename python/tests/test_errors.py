# SPDX-License-Identifier: MIT
"""Bad files raise the right kiln.Error subclass, with the descriptor, field and offset."""

import errno

import numpy as np
import pytest

import kiln
from conftest import golden_bytes


def good(tmp_path):
    p = tmp_path / "good.klnt"
    kiln.save_file({"alpha": np.arange(4, dtype=np.float32), "beta": np.arange(3, dtype=np.int8)},
                   str(p))
    return p.read_bytes()


def test_hierarchy():
    for cls in (kiln.FrameError, kiln.FormatTypeError, kiln.LimitError, kiln.UTF8Error):
        assert issubclass(cls, kiln.FormatError) and issubclass(cls, kiln.Error)
        assert not issubclass(cls, OSError)
    assert issubclass(kiln.FileError, kiln.Error) and issubclass(kiln.FileError, OSError)
    assert not issubclass(kiln.FormatTypeError, TypeError)


def test_frame(write_bytes, tmp_path):
    data = bytearray(good(tmp_path))
    data[0:4] = b"GGUF"
    path = write_bytes(bytes(data))
    with pytest.raises(kiln.FrameError) as e:
        kiln.open(path, format="klnt")
    assert e.value.cls == "FRAME" and e.value.field == "magic" and e.value.offset == 0
    assert e.value.tensor is None
    # Told from its first bytes, it is a GGUF file, and the GGUF reader says what is wrong.
    with pytest.raises(kiln.FormatError) as e:
        kiln.open(path)
    assert e.value.cls != "FRAME" or e.value.field == "version"


def test_limit_truncated(write_bytes, tmp_path):
    data = good(tmp_path)
    for n in (0, 10, 63, 100, len(data) - 1):
        with pytest.raises(kiln.LimitError) as e:
            kiln.open(write_bytes(data[:n]))
        assert e.value.cls == "LIMIT" and e.value.code == 3


def test_trailing_bytes_are_frame(write_bytes, tmp_path):
    with pytest.raises(kiln.FrameError):
        kiln.open(write_bytes(good(tmp_path) + b"\0"))


def test_utf8(write_bytes, tmp_path):
    data = bytearray(good(tmp_path))
    heap = data.index(b"alphabeta")
    data[heap + 5] = 0xFF  # the first byte of "beta"
    with pytest.raises(kiln.UTF8Error) as e:
        kiln.open(write_bytes(bytes(data)))
    assert e.value.tensor == 1 and e.value.offset == heap + 5 and e.value.field is not None


def test_type_descriptor_field(write_bytes, tmp_path):
    data = bytearray(good(tmp_path))
    data[64 + 128 + 2] = 9  # descriptor 1: rank 9
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(write_bytes(bytes(data)))
    assert e.value.tensor == 1 and e.value.field == "rank" and e.value.offset == 64 + 128 + 2
    assert "descriptor 1" in str(e.value)


def test_verify_payload(write_bytes, tmp_path):
    data = bytearray(good(tmp_path))
    with kiln.open(write_bytes(bytes(data))) as d:
        gap = d["alpha"].file_offset + d["alpha"].nbytes
    data[gap] = 1
    path = write_bytes(bytes(data))
    with kiln.open(path) as d:  # structure is fine; the gap is checked only on request
        with pytest.raises(kiln.FormatTypeError) as e:
            d.verify_payload()
        assert e.value.offset == gap
        assert d.info["payload_verified"] is False
    with pytest.raises(kiln.FormatTypeError):
        kiln.open(path, verify_payload=True)


def test_golden_invalid_has_detail(write_bytes):
    with pytest.raises(kiln.FormatTypeError) as e:
        kiln.open(write_bytes(golden_bytes("kiln-v2-empty-name-flag")))
    assert e.value.field is not None and e.value.offset is not None


def test_file_errors(tmp_path):
    with pytest.raises(kiln.FileError) as e:
        kiln.open(str(tmp_path / "missing.klnt"))
    assert e.value.errno == errno.ENOENT and e.value.cls == "IO" and e.value.code == 16
    assert isinstance(e.value, OSError)
    with pytest.raises(kiln.FileError) as e:
        kiln.open(str(tmp_path))
    assert e.value.errno == errno.EISDIR
    with pytest.raises(kiln.FileError) as e:
        kiln.save_file({"a": np.zeros(1)}, str(tmp_path / "no" / "dir" / "x.klnt"))
    assert e.value.errno == errno.ENOENT


def test_api_misuse(tmp_path, write_bytes):
    path = write_bytes(good(tmp_path))
    with pytest.raises(ValueError, match="source"):
        kiln.open(path, source="carrier-pigeon")
    with pytest.raises(TypeError):
        kiln.open(path, "mmap")  # options are keyword-only
    with kiln.open(path) as d:
        with pytest.raises(KeyError):
            d["gamma"]
        with pytest.raises(IndexError):
            d[2]
        with pytest.raises(IndexError):
            d[-3]
    with pytest.raises(ValueError, match="closed"):
        d.verify_payload()
    with pytest.raises(ValueError, match="closed"):
        d.__enter__()
