# SPDX-License-Identifier: MIT
"""URLs from Python: kiln.open and the safetensors drop-in on s3:// and https:// objects, the
same tensors as the local files, and a server's error as the exception. Needs the servers of
tests/remote_test.sh, which runs this file with their addresses in the environment; skipped
otherwise (the plain `python` ctest)."""

import os

import numpy as np
import pytest

ROOT = os.environ.get("KILN_TEST_ROOT")
pytestmark = pytest.mark.skipif(not os.environ.get("KILN_TEST_S3_ENDPOINT"),
                                reason="run by tests/remote_test.sh (the test servers)")

import kiln  # noqa: E402
import kiln.safetensors.numpy as stnp  # noqa: E402


@pytest.fixture(autouse=True)
def s3_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("KILN_TEST_S3_ACCESS", ""))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("KILN_TEST_S3_SECRET", ""))
    monkeypatch.setenv("AWS_ENDPOINT_URL", os.environ.get("KILN_TEST_S3_ENDPOINT", ""))


def same(a, b):
    assert a.keys() == b.keys() and len(a) == len(b)
    for k in a.keys():
        x, y = a[k], b[k]
        assert x.shape == y.shape and x.dtype == y.dtype
        assert x.numpy(raw=True).tobytes() == y.numpy(raw=True).tobytes()


def test_open_klnt_and_gguf_from_s3():
    for f in ("m.klnt", "tiny-llama.gguf"):
        with kiln.open("s3://models/" + f) as m, kiln.open(os.path.join(ROOT, f)) as l:
            same(m, l)
            assert m.paths == ["s3://models/" + f]


def test_safetensors_over_https_and_s3(monkeypatch):
    monkeypatch.setenv("CURL_CA_BUNDLE", os.environ["KILN_TEST_CA"])
    url = os.environ["KILN_TEST_HTTPS"] + "/m.safetensors"
    with stnp.safe_open(url, framework="np") as f, \
            stnp.safe_open(os.path.join(ROOT, "m.safetensors"), framework="np") as g:
        assert list(f.keys()) == list(g.keys())
        for k in f.keys():
            np.testing.assert_array_equal(f.get_tensor(k), g.get_tensor(k))
    d = stnp.load_file("s3://models/m.safetensors")
    e = stnp.load_file(os.path.join(ROOT, "m.safetensors"))
    assert sorted(d) == sorted(e)
    for k in d:
        np.testing.assert_array_equal(d[k], e[k])


def test_a_server_error_is_the_exception():
    with pytest.raises(kiln.FileError) as e:
        kiln.open("s3://models/none.klnt")
    assert "HTTP 404 NoSuchKey" in str(e.value) and "s3://models/none.klnt" in str(e.value)


def test_torch_load_of_urls():
    torch = pytest.importorskip("torch")
    for f in ("m.klnt", "tiny-sharded/model.safetensors.index.json"):
        a = kiln.torch.load("s3://models/" + f, threads=2)
        b = kiln.torch.load(os.path.join(ROOT, f))
        assert list(a) == list(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
            assert torch.equal(a[k].reshape(-1).view(torch.uint8) if a[k].dtype != torch.uint8
                               else a[k].reshape(-1),
                               b[k].reshape(-1).view(torch.uint8) if b[k].dtype != torch.uint8
                               else b[k].reshape(-1)), k
