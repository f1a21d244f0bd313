# SPDX-License-Identifier: MIT
"""The native API beyond views: copies, reads into caller buffers, streams, hints, threads."""

import threading

import numpy as np
import pytest

import kiln

DATA = {"a": np.arange(3000, dtype=np.float32).reshape(30, 100),
        "b": np.arange(17, dtype=np.uint8), "e": np.zeros((0, 4), np.int16)}


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "n.klnt")
    kiln.save_file(DATA, p)
    return p


@pytest.mark.parametrize("source", ["mmap", "read", "uring", "auto"])
def test_copy_is_writable_and_separate(path, source):
    with kiln.open(path, source=source) as d:
        for k, v in DATA.items():
            c = d[k].copy()
            assert c.flags.writeable and c.dtype == v.dtype
            np.testing.assert_array_equal(c, v)
            assert not np.shares_memory(c, d[k].numpy())
            c[...] = 1  # ours to write
        assert d["a"].copy(raw=True).tobytes() == DATA["a"].tobytes()


def test_read_into(path):
    with kiln.open(path) as d:
        assert repr(d).startswith("<kiln.Dir 3 tensors, ") and repr(d).endswith(" mmap>")
        assert repr(d["b"]) == "<kiln.Tensor 1 'b' u8 (17,)>"
        buf = bytearray(d["a"].nbytes + 5)
        assert d["a"].read_into(buf) == DATA["a"].nbytes
        assert bytes(buf[:DATA["a"].nbytes]) == DATA["a"].tobytes()
        out = np.empty(17, np.uint8)
        d["b"].read_into(out)
        np.testing.assert_array_equal(out, DATA["b"])
        with pytest.raises(ValueError, match="cannot hold"):
            d["a"].read_into(bytearray(10))
        with pytest.raises(BufferError):
            d["a"].read_into(bytes(20000))  # not writable
    assert repr(d) == "<kiln.Dir closed>"


@pytest.mark.parametrize("engine", ["auto", "uring", "pread"])
def test_stream(path, engine):
    with kiln.open(path) as d:
        a = np.empty_like(DATA["a"])
        b = bytearray(17)
        e = np.empty((0, 4), np.int16)
        res = d.stream([("a", a), (1, b), (d["e"], e)], engine=engine, chunk_size=4096)
        np.testing.assert_array_equal(a, DATA["a"])
        assert bytes(b) == DATA["b"].tobytes()
        assert res["bytes"] == DATA["a"].nbytes + 17
        assert res["engine"] in ("uring", "pread") and res["chunks"] >= 3
        with pytest.raises(ValueError, match="cannot hold"):
            d.stream([("a", bytearray(1))])
        with pytest.raises(KeyError):
            d.stream([("zzz", bytearray(1))])
        with pytest.raises(ValueError, match="engine"):
            d.stream([], engine="carrier-pigeon")
        with kiln.open(path) as other:
            with pytest.raises(ValueError, match="another directory"):
                d.stream([(other["a"], a)])


def test_hint(path):
    with kiln.open(path) as d:
        d.hint()
        d.hint(["a", 1], "dontneed")
        d.hint([d["a"]], hint="cold")
        with pytest.raises(ValueError, match="hint"):
            d.hint(None, "forget")
        with pytest.raises(IndexError):
            d.hint([3])
    with kiln.open(path, source="read") as d:
        with pytest.raises(kiln.Error) as e:
            d.hint()
        assert e.value.cls == "UNSUPPORTED" and type(e.value) is kiln.Error


def test_threads_share_a_directory(path):
    d = kiln.open(path)
    views = {k: d[k] for k in DATA}
    errors = []

    def work(k):
        try:
            for _ in range(50):
                np.testing.assert_array_equal(views[k].copy(), DATA[k])
                np.testing.assert_array_equal(views[k].numpy(), DATA[k])
        except Exception as exc:  # reported below
            errors.append(exc)

    def verify():
        try:
            with kiln.open(path) as own:
                for _ in range(50):
                    own.verify_payload()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in ("a", "b") * 4]
    threads += [threading.Thread(target=verify) for _ in range(2)]
    for t in threads:
        t.start()
    d.close()  # while they run: the views they hold keep the directory open
    for t in threads:
        t.join()
    assert errors == []


def test_write_quantized_and_opaque(tmp_path):
    p = str(tmp_path / "q.klnt")
    kiln.write_file(p, [
        ("q", "e2m1", (4, 16), bytes(range(32)),
         {"quant_scheme": 2, "quant_axis": 1, "group_size": 16, "scale_index": 1,
          "outer_index": 2}),
        ("q.scale", "f8e4m3", (4, 1), bytes([0x38] * 4)),
        ("q.outer", "f32", (), np.float32(0.5).tobytes()),
        ("blk", 4096, (64,), bytes(68), {"layout": "Q8_0", "block_size": 34}),
    ])
    with kiln.open(p, verify_payload=True) as d:
        q = d["q"]
        assert (q.quant_scheme, q.quant_axis, q.group_size) == (2, 1, 16)
        assert q.scale.name == "q.scale" and q.outer.name == "q.outer"
        assert q.outer.numpy() == np.float32(0.5) and q.outer.shape == ()
        assert q.numpy(raw=True).tobytes() == bytes(range(32))
        b = d["blk"]
        assert (b.dtype, b.dtype_code, b.layout, b.block_size, b.nbytes) == \
            ("opaque", 4096, "Q8_0", 34, 68)
        assert b.quant_axis is None and b.scale is None
    with pytest.raises(kiln.FormatTypeError) as e:  # the writer refuses what the reader would
        kiln.write_file(p, [("q", "e2m1", (4,), bytes(2), {"quant_scheme": 1, "quant_axis": 3,
                                                           "group_size": 4, "scale_index": 0})])
    assert e.value.tensor == 0 and e.value.field is not None
    with pytest.raises(ValueError, match="unknown tensor field"):
        kiln.write_file(p, [("q", "u8", (1,), b"x", {"colour": 1})])
    with pytest.raises(ValueError, match="unknown dtype"):
        kiln.write_file(p, [("q", "u7", (1,), b"x")])
    with pytest.raises(OverflowError):
        kiln.write_file(p, [("q", "u8", (1,), b"x", {"quant_axis": 1 << 16})])


def test_names_with_nul_and_unicode(tmp_path):
    p = str(tmp_path / "names.klnt")
    names = ["a\0b", "a", "\u00e9t\u00e9/\U0001f525"]
    kiln.save_file({n: np.array([i], np.int32) for i, n in enumerate(names)}, p)
    with kiln.open(p) as d:
        assert d.keys() == names
        for i, n in enumerate(names):
            assert d[n].index == i and d[n].name == n and n in d
        assert "a\0" not in d
    with pytest.raises(ValueError, match="empty"):
        kiln.save_file({"": np.zeros(1)}, p)


@pytest.mark.parametrize("source", ["read", "uring"])
def test_threads_load_the_same_bytes(tmp_path, source):
    # 6 MiB and a bit: three 2 MiB parts, each read by its own thread into one block.
    big = {"w": (np.arange(6 * 2**20 // 4 + 7, dtype=np.uint32) * 2654435761).astype(np.uint32),
           "x": np.arange(5, dtype=np.int8)}
    p = str(tmp_path / "big.klnt")
    kiln.save_file(big, p)
    for threads in (0, 1, 3, 64):
        with kiln.open(p, source=source, threads=threads) as d:
            for k, v in big.items():
                np.testing.assert_array_equal(d[k].numpy(), v)
    with pytest.raises(kiln.Error, match="threads"):
        kiln.open(p, source=source, threads=65)


def test_auto_source_maps_a_cached_file(path):
    # The file was just written, so it is in the page cache: AUTO maps it (and populates it).
    with open(path, "rb") as f:
        f.read()
    with kiln.open(path, source="auto") as d:
        assert d.info["source"] == "mmap"
        assert d.info["auto_choice"] == "cached"
        for k, v in DATA.items():
            np.testing.assert_array_equal(d[k].numpy(), v)
    with kiln.open(path) as d:
        assert d.info["auto_choice"] == ""
    with pytest.raises(ValueError, match="auto"):
        kiln.open(path, source="tape")


def test_pack_views_gives_the_same_tensors(tmp_path):
    # 2,000 tensors: enough views (368 KB) to be packed; shapes and dtypes vary.
    many = {f"blk.{i // 7}.t{i % 7}": np.full((1 + i % 3, 1 + i % 5), i,
                                               dtype=[np.float32, np.float16, np.uint8][i % 3])
            for i in range(2000)}
    p = str(tmp_path / "many.klnt")
    kiln.save_file(many, p)
    with kiln.open(p) as plain, kiln.open(p, pack_views=True) as packed:
        names = list(many)
        assert packed.keys() == plain.keys()
        seen = {}

        def walk(start):  # threads ask for views in different orders, unpacking pages at once
            for k in range(len(names)):
                n = names[(start + k * 7) % len(names)]
                seen[(start, n)] = packed[n].numpy().copy()

        threads = [threading.Thread(target=walk, args=(s,)) for s in (0, 500, 1000, 1500)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for (start, n), got in seen.items():
            np.testing.assert_array_equal(got, many[n])
            assert packed[n].shape == plain[n].shape and packed[n].dtype == plain[n].dtype
        assert len(seen) == 4 * len(names)
