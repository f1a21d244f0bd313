# SPDX-License-Identifier: MIT
"""A shard series (STEM-NNNNN-of-MMMMM.klnt) opened from any shard is one model: keys, tensors,
slices, metadata and the native Dir cover every shard (the core's kiln_set)."""

import os

import numpy as np
import pytest

import kiln

SHARDS = {
    1: {"embed": np.arange(12, dtype=np.float32).reshape(3, 4),
        "layers.0.w": np.arange(-6, 6, dtype=np.int16).reshape(2, 6)},
    2: {"layers.1.w": np.linspace(0, 1, 20, dtype=np.float64).reshape(4, 5)},
    3: {"head": np.arange(30, dtype=np.uint8).reshape(5, 6),
        "norm": np.array([True, False, True]),
        "scale": np.array([1.5, -2.0], dtype=np.float16)},
}
ALL = {k: v for shard in SHARDS.values() for k, v in shard.items()}
META = {"format": "pt", "model": "three shards"}


def shard_path(d, no, total=3, stem="model"):
    return os.path.join(d, f"{stem}-{no:05d}-of-{total:05d}.klnt")


@pytest.fixture
def series(tmp_path):
    """The metadata document in the first shard, as the converters place it."""
    for no, tensors in SHARDS.items():
        kiln.save_file(tensors, shard_path(str(tmp_path), no),
                       metadata=META if no == 1 else None, one_file=True)
    return str(tmp_path)


@pytest.mark.parametrize("no", [1, 2, 3])
def test_safe_open_from_any_shard(series, no):
    with kiln.safe_open(shard_path(series, no), "np") as f:
        assert f.keys() == sorted(ALL)
        for k, v in ALL.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape
            np.testing.assert_array_equal(got, v)
            assert not got.flags.writeable
        assert f.metadata() == META
        np.testing.assert_array_equal(f.get_slice("layers.1.w")[1:3, ::-2],
                                      ALL["layers.1.w"][1:3, ::-2])
        np.testing.assert_array_equal(f.get_slice("head")[::2, 4:], ALL["head"][::2, 4:])
        with pytest.raises(KeyError):
            f.get_tensor("missing")


def test_load_file_of_a_series(series):
    got = kiln.load_file(shard_path(series, 2))
    assert got.keys() == ALL.keys()
    for k, v in ALL.items():
        np.testing.assert_array_equal(got[k], v)


def test_metadata_in_a_later_shard(tmp_path):
    """metadata() comes from whichever shard holds the document."""
    d = str(tmp_path)
    for no, tensors in SHARDS.items():
        kiln.save_file(tensors, shard_path(d, no), metadata=META if no == 3 else None,
                       one_file=True)
    with kiln.safe_open(shard_path(d, 1), "np") as f:
        assert f.metadata() == META and f.keys() == sorted(ALL)


def test_native_dir_over_the_set(series):
    with kiln.open(shard_path(series, 3)) as d:
        assert len(d) == len(ALL) + 1  # and the metadata document
        assert d.info["shards"] == 3 and d.info["tensor_count"] == len(d)
        assert d.paths == [shard_path(series, n) for n in (1, 2, 3)]
        assert "head" in d and "missing" not in d
        assert [t.name for t in d] == d.keys()
        # Global indices run shard by shard; index is the descriptor index in the shard.
        t = d["layers.1.w"]
        assert (t.shard, t.index, t.set_index) == (1, 0, 3)
        assert d[3].name == "layers.1.w" and d[-1].name == "scale"
        h = d["head"]
        assert (h.shard, h.index, h.set_index) == (2, 0, 4)
        np.testing.assert_array_equal(d[h.set_index].numpy(), ALL["head"])
        with pytest.raises(IndexError):
            d[len(d)]
        # Streams go to each shard's file; hints to each shard's mapping.
        bufs = {k: np.empty_like(v) for k, v in ALL.items()}
        res = d.stream([(k, b) for k, b in bufs.items()])
        assert res["bytes"] == sum(v.nbytes for v in ALL.values())
        for k, v in ALL.items():
            np.testing.assert_array_equal(bufs[k], v)
        buf = np.empty_like(ALL["norm"])
        d.stream([(d["norm"], buf)])
        np.testing.assert_array_equal(buf, ALL["norm"])
        d.hint(["embed", "head", 4], "willneed")
        d.verify_payload()
        np.testing.assert_array_equal(d["scale"].copy(), ALL["scale"])
        assert "3 shards" in repr(d)


def test_one_file_is_not_a_series(tmp_path):
    """A name that is no series name is one file, even beside a series."""
    p = str(tmp_path / "model-00001-of-00003.klnt.bak")
    kiln.save_file({"a": np.zeros(2)}, p)
    with kiln.open(p) as d:
        assert d.info["shards"] == 1 and d.paths == [p]
        assert (d["a"].shard, d["a"].set_index) == (0, 0)


def test_missing_shard(series):
    os.unlink(shard_path(series, 2))
    with pytest.raises(kiln.FileError, match="shard 2 of 3 is missing") as e:
        kiln.safe_open(shard_path(series, 1))
    assert e.value.cls == "IO"


def test_name_in_two_shards(tmp_path):
    d = str(tmp_path)
    kiln.save_file({"a": np.zeros(1)}, shard_path(d, 1, 2), one_file=True)
    kiln.save_file({"a": np.ones(1)}, shard_path(d, 2, 2), one_file=True)
    with pytest.raises(kiln.FormatTypeError):
        kiln.open(shard_path(d, 2, 2))


def test_series_lifetime(series):
    """Arrays from every shard outlive the Dir: the whole set stays open until the last one."""
    import gc

    with kiln.safe_open(shard_path(series, 1), "np") as f:
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    del f
    gc.collect()
    for k, v in ALL.items():
        np.testing.assert_array_equal(arrays[k], v)


def test_series_in_torch(series):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    before = open(shard_path(series, 3), "rb").read()
    with kiln.safe_open(shard_path(series, 2), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in ALL.items():
        assert torch.equal(got[k], torch.from_numpy(v))
    got["head"].fill_(0)  # every shard is mapped copy-on-write
    assert open(shard_path(series, 3), "rb").read() == before


def test_save_file_of_any_size_writes_a_series(tmp_path):
    # 5,000 tensors of 40-byte names need some 200 KiB of name heap: several files.
    sd = {f"model.layers.{i:04d}.mlp.experts.down_proj.w": np.full(2, i, np.int32)
          for i in range(5000)}
    first = kiln.save_file(sd, tmp_path / "big.klnt", metadata={"k": "v"})
    files = sorted(os.listdir(tmp_path))
    assert len(files) > 1 and first == str(tmp_path / files[0])
    assert files[0] == f"big-00001-of-{len(files):05d}.klnt"
    back = kiln.load_file(first)
    assert list(back) == sorted(sd) and all((back[k] == v).all() for k, v in sd.items())
    with kiln.safe_open(tmp_path / files[-1]) as f:  # any shard opens the whole
        assert len(f.keys()) == 5000 and f.metadata() == {"k": "v"}
    # One shard alone only when asked, never silently.
    one = kiln.load_file(first, one_file=True)
    assert 0 < len(one) < 5000
    # Written again small, the series is replaced by the single file.
    assert kiln.save_file({"x": np.zeros(1)}, tmp_path / "big.klnt") == str(tmp_path / "big.klnt")
    assert os.listdir(tmp_path) == ["big.klnt"]


def test_save_file_max_shard_size_and_refusals(tmp_path):
    sd = {f"t{i}": np.zeros(16, np.float32) for i in range(6)}  # 64 bytes each
    first = kiln.save_file(sd, tmp_path / "m.klnt", max_shard_size=128)
    assert first.endswith("m-00001-of-00003.klnt") and len(os.listdir(tmp_path)) == 3
    assert sorted(kiln.load_file(first)) == sorted(sd)
    with pytest.raises(kiln.Error, match="named like shard 1 of 2"):
        kiln.save_file(sd, tmp_path / "x-00001-of-00002.klnt")
    with pytest.raises(ValueError, match="max_shard_size"):
        kiln.save_file(sd, tmp_path / "y.klnt", max_shard_size=0)
