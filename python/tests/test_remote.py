# SPDX-License-Identifier: MIT
"""URLs from Python: kiln.open and the safetensors drop-in on s3:// and https:// objects, the
same tensors as the local files, and a server's error as the exception. Needs the servers of
tests/remote_test.sh, which runs this file with their addresses in the environment; skipped
otherwise (the plain `python` ctest)."""

import errno
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


def test_torch_load_of_a_url_checks_its_own_digests():
    """m.klnt (klnt gen) carries its digest table: verify=True reads it with ranged GETs and
    checks each part against that table as it lands; the same tensors as unverified. m-flip.klnt
    (8 bytes changed at byte 2000000, its table m.klnt's) fails naming the URL and chunk 1;
    opened directory-only with verify=True, a tensor outside that chunk reads, one in it
    does not, and each read hashes only the chunks it touches."""
    torch = pytest.importorskip("torch")
    import kiln.torch as kt

    def raw(t):  # the bytes (random payloads hold NaNs, which no equality sees as equal)
        t = t.reshape(-1)
        return t if t.dtype == torch.uint8 else t.view(torch.uint8)

    url = os.environ["KILN_TEST_HTTP"] + "/m.klnt"
    got, want = kt.load(url, verify=True), kt.load(url)
    assert list(got) == list(want) and all(torch.equal(raw(got[k]), raw(want[k])) for k in want)
    with kiln.open(url) as m:
        assert m.verify_digests()["source"] == "embedded"
    flip = os.environ["KILN_TEST_HTTP"] + "/m-flip.klnt"
    with pytest.raises(kiln.CorruptError, match=r"m-flip\.klnt: chunk 1 \(bytes 1048576\.\."):
        kt.load(flip, verify=True)
    with kiln.open(flip, directory_only=True, verify=True) as m:
        views = [m[i] for i in range(len(m))]
        bad = [t for t in views
               if t.file_offset < 2 << 20 and t.file_offset + t.nbytes > 1 << 20]
        good = [t for t in views if t.file_offset >= 3 << 20 and t.nbytes][0]
        assert bad
        with pytest.raises(kiln.CorruptError, match="chunk 1 "):
            bad[0].read_into(bytearray(bad[0].nbytes))
        before = m.info["digest_bytes"]
        good.read_into(bytearray(good.nbytes))
        hashed = m.info["digest_bytes"] - before
        assert good.nbytes <= hashed <= good.nbytes + (2 << 20), (hashed, good.nbytes)


def test_a_url_is_checked_against_its_sidecar_on_the_server():
    """A GGUF without a table of its own, served with a sidecar made from a local copy
    (write_digests) beside it: the URL is checked against the server's sidecar, whole and in
    parts; without the sidecar it has no digests."""
    torch = pytest.importorskip("torch")
    import shutil

    import kiln.torch as kt

    name = "py-sidecar.gguf"
    local = os.path.join(ROOT, name)
    shutil.copyfile(os.path.join(ROOT, "tiny-llama.gguf"), local)
    url = os.environ["KILN_TEST_HTTP"] + "/" + name
    try:
        with pytest.raises(kiln.Error, match="no .kiln-digest beside it on the server"):
            kt.load(url, verify=True)
        with kiln.open(local) as m:
            m.write_digests()
        with kiln.open(url) as m:
            r = m.verify_digests()
            assert r["source"] == "sidecar" and r["bytes"] == os.path.getsize(local)
        got, want = kt.load(url, verify=True), kt.load(local)
        assert list(got) == list(want)
        for k in want:  # as bytes: a quantized tensor's are raw, and NaN equals nothing
            a, b = got[k].reshape(-1), want[k].reshape(-1)
            assert a.dtype == b.dtype and a.numel() == b.numel(), k
            if a.dtype != torch.uint8:
                a, b = a.view(torch.uint8), b.view(torch.uint8)
            assert torch.equal(a, b), k
    finally:
        for f in (local, local + ".kiln-digest"):
            if os.path.exists(f):
                os.unlink(f)


def test_iter_load_of_urls():
    torch = pytest.importorskip("torch")
    import kiln.torch

    for f in ("m.klnt", "tiny-sharded/model.safetensors.index.json"):
        it = kiln.torch.iter_load("s3://models/" + f, window_bytes=2 << 20, threads=2)
        a = list(it)
        b = kiln.torch.load(os.path.join(ROOT, f))
        assert [k for k, _ in a] == list(b)
        assert it.bytes_read == it.total_bytes  # ranged GETs of the tensors, nothing whole
        for k, v in a:
            assert v.dtype == b[k].dtype and v.shape == b[k].shape
            assert torch.equal(v.reshape(-1).view(torch.uint8) if v.dtype != torch.uint8
                               else v.reshape(-1),
                               b[k].reshape(-1).view(torch.uint8) if b[k].dtype != torch.uint8
                               else b[k].reshape(-1)), k


GROUP_WORKER = """
import hashlib, json, os, sys, datetime
import torch, torch.distributed as dist
import kiln
# A file store for the rendezvous: no port to pick, so none another process can take first.
dist.init_process_group("gloo", init_method="file://" + os.environ["KILN_TEST_RDV"],
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                        timeout=datetime.timedelta(seconds=60))
url, out, tp = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
stats = {}
sd = kiln.torch.load(url, group=True, tp=tp, stats=stats)
digest = {k: hashlib.sha256(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
          .hexdigest() for k, v in sd.items()}
json.dump({"tensors": digest, "stats": stats}, open(out, "w"))
dist.destroy_process_group()
"""


def test_group_load_of_a_url_reads_it_once(tmp_path):
    # Two ranks (gloo) load one URL: each fetches its own chunks and its tp shares with ranged
    # GETs, and the objects' bytes cross the wire once between them (the fault proxy counts).
    torch = pytest.importorskip("torch")
    import hashlib
    import json
    import subprocess
    import sys
    import urllib.request

    local = os.path.join(ROOT, "m.klnt")
    full = kiln.torch.load(local)
    with kiln.open(local) as d:
        tp = {t.name: i % 2 for i, t in enumerate(d)
              if t.dtype in ("f32", "f16", "bf16") and len(t.shape) == 2}
    assert len(tp) > 10
    proxy = os.environ["KILN_TEST_PROXY"]
    urllib.request.urlopen(proxy + "/_reset").read()
    script = tmp_path / "w.py"
    script.write_text(GROUP_WORKER)
    for url, name in ((proxy + "/ok:group/m.klnt", "http"), ("s3://models/m.klnt", "s3")):
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                       KILN_TEST_RDV=str(tmp_path / f"rdv-{name}"))
            out = tmp_path / f"{name}-{r}.json"
            procs.append((subprocess.Popen([sys.executable, str(script), url, str(out),
                                            json.dumps(tp)], env=env), out))
        payload = read = 0
        for r, (p, out) in enumerate(procs):
            assert p.wait(timeout=120) == 0, name
            res = json.loads(out.read_text())
            for k, v in full.items():
                want = torch.tensor_split(v, 2, dim=tp[k])[r] if k in tp else v
                b = want.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                assert res["tensors"][k] == hashlib.sha256(b).hexdigest(), (name, r, k)
            st = res["stats"]
            read += st["bytes_read"] + st["tp_bytes_read"]
            payload = st["bytes_read"] + st["bytes_received"]  # the same on every rank
        whole = sum(v.numel() * v.element_size() for k, v in full.items() if k not in tp)
        assert payload == whole
        assert read == whole + sum(v.numel() * v.element_size()
                                   for k, v in full.items() if k in tp)
    # Over HTTP, what the proxy passed: the file once, plus each rank's first GET (256 KiB),
    # plus the rows of shares along axis 1 fetched with the other rank's half between them
    # (one GET for rows a small gap apart, not one per row).
    wire = int(urllib.request.urlopen(proxy + "/_bytes/ok:group/m.klnt").read())
    size = os.path.getsize(local)
    inner = sum(full[k].numel() * full[k].element_size() for k in tp if tp[k] == 1)
    assert size <= wire <= size + inner + 2 * (512 << 10), (wire, size, inner)
    requests = int(urllib.request.urlopen(proxy + "/_count/ok:group/m.klnt").read())
    # About one GET per share and rank (a share's rows go together), not one per row.
    rows = sum(full[k].shape[0] for k in tp if tp[k] == 1)
    assert requests < 2 * (len(tp) + 16) < rows, (requests, len(tp), rows)


def test_safe_open_of_a_url_raises_what_happened(monkeypatch):
    """A refused connection, a 403 and a 404 are three different failures, each with kiln's
    message (the drop-in used to call every one of them "No such file or directory")."""
    with pytest.raises(ConnectionRefusedError) as e:
        stnp.safe_open("http://127.0.0.1:1/m.safetensors", framework="np")
    assert "127.0.0.1:1/m.safetensors" in str(e.value)
    with pytest.raises(FileNotFoundError):
        stnp.safe_open("s3://models/none.safetensors", framework="np")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(PermissionError) as e:
        stnp.safe_open("s3://models/m.safetensors", framework="np")
    assert "HTTP 403" in str(e.value) and "[Errno 13] [Errno" not in str(e.value)


def test_messages_leave_credentials_out():
    proxy = os.environ["KILN_TEST_PROXY"][len("http://"):]
    url = (f"http://user:pa55word@{proxy}/404/none.safetensors"
           "?X-Amz-Signature=5ecret5ig&X-Amz-Credential=AKIDSECRET")
    for opener in (lambda: stnp.safe_open(url, framework="np"), lambda: kiln.open(url)):
        with pytest.raises(OSError) as e:
            opener()
        for secret in ("pa55word", "5ecret5ig", "AKIDSECRET"):
            assert secret not in str(e.value)
    assert kiln._kiln.shown(url).endswith("none.safetensors?...")


def test_timeout_ends_a_dripping_server():
    import errno
    import time

    url = os.environ["KILN_TEST_PROXY"] + "/drip/m.klnt"
    t0 = time.monotonic()
    with pytest.raises(kiln.FileError) as e:
        kiln.open(url, timeout=2)
    assert e.value.errno == errno.ETIMEDOUT and "/drip/m.klnt" in str(e.value)
    assert time.monotonic() - t0 < 15
    with pytest.raises(ValueError):
        kiln.open(url, timeout=-1)


def test_a_shared_cache_is_not_used_and_says_why(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    with pytest.warns(RuntimeWarning, match="not used as the cache: others can write to it"):
        with kiln.open("s3://models/m.klnt") as m:
            assert m.info["cache_refused"] == errno.EPERM
            assert m.info["source"] == "remote"
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("call", ["kiln.torch.load(sys.argv[1])", "kiln.open(sys.argv[1])"])
def test_ctrl_c_stops_a_load_of_a_url_in_flight(tmp_path, call):
    pytest.importorskip("torch")
    # The proxy's "slow" mode sends 64 KiB a second a connection after the first request: the
    # load would take about 48 s. SIGINT after 2 s must end it with KeyboardInterrupt at once.
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "load.py"
    script.write_text(
        "import sys, kiln.torch\n"
        "print('loading', flush=True)\n"
        "try:\n"
        "    " + call + "\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(42)\n")
    url = os.environ["KILN_TEST_PROXY"] + "/slow:%d%d/m.klnt" % (os.getpid(), len(call))
    p = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"loading\n"  # torch imported: the load is what runs now
    time.sleep(2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    assert rc == 42
    assert time.monotonic() - t0 < 3
