# SPDX-License-Identifier: MIT
"""kiln.vllm and kiln.sglang against stand-ins of vLLM's and SGLang's loader API
(python/tests/standins/, each file citing the upstream commit it follows; neither runtime can
be installed on these machines): the entry point found through importlib.metadata,
get_model_loader(LoadConfig(load_format="kiln")), a toy model with vLLM's weight-loader
pattern (each tensor narrowed for tensor-parallel rank 0 or 1 and copy_'d into the parameter)
filled bit-exactly from a sharded safetensors checkpoint, GGUF and KLNT, parameters left
unfilled named, options refused by name, the hub download through the runtime's helper, two
gloo ranks reading once, and SGLang's class-as-load_format."""

import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import kiln
from conftest import klnt_cli, klnt_env

torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
import kiln.safetensors.torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "standins")
ROOT = os.path.join(HERE, "..", "..")

# name -> (shape, dtype, tensor-parallel axis or None for replicated)
CHECKPOINT = {
    "model.embed.weight": ((8, 6), torch.float16, 0),
    "model.layers.0.qkv.weight": ((6, 4), torch.bfloat16, 0),
    "model.layers.0.o.weight": ((4, 6), torch.float32, 1),
    "model.layers.0.norm.weight": ((4,), torch.float32, None),
    "model.layers.1.qkv.weight": ((6, 4), torch.bfloat16, 0),
    "model.layers.1.o.weight": ((4, 6), torch.float32, 1),
    "model.layers.1.norm.weight": ((4,), torch.float32, None),
    "lm_head.weight": ((8, 6), torch.float16, 0),
}


def _tensors():
    g = torch.Generator().manual_seed(7)
    return {k: torch.randn(shape, generator=g).to(dt) for k, (shape, dt, _) in CHECKPOINT.items()}


class Toy(torch.nn.Module):
    """A model as vLLM writes them: parameters already narrowed to this rank's share, each with
    a weight_loader that narrows the full checkpoint tensor and copies it in; load_weights
    consumes (name, tensor) pairs and returns the names it filled."""

    def __init__(self, tp_rank, tp_size, bias=False):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        spec = dict(CHECKPOINT)
        if bias:
            spec["model.layers.1.bias"] = ((4,), torch.float32, None)
        for name, (shape, dtype, axis) in spec.items():
            *path, leaf = name.split(".")
            mod = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            shape = list(shape)
            if axis is not None:
                shape[axis] //= tp_size
            p = torch.nn.Parameter(torch.full(shape, -1).to(dtype), requires_grad=False)
            p.weight_loader = self._loader(axis)
            mod.register_parameter(leaf, p)

    def _loader(self, axis):
        def load(param, w):
            if axis is not None:
                share = param.shape[axis]
                w = w.narrow(axis, self.tp_rank * share, share)
            assert param.shape == w.shape and param.dtype == w.dtype
            param.data.copy_(w)
        return load

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            params[name].weight_loader(params[name], w)
            loaded.add(name)
        return loaded


def _expect_filled(model, full, rank, size):
    for name, p in model.named_parameters():
        axis = CHECKPOINT[name][2]
        want = full[name] if axis is None else torch.tensor_split(full[name], size, axis)[rank]
        assert p.dtype == want.dtype and p.shape == want.shape, name
        assert torch.equal(p.data.contiguous().view(torch.uint8),
                           want.contiguous().view(torch.uint8)), name


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same tensors as a sharded safetensors checkpoint (a directory with its index), a
    KLNT file and a GGUF file (klnt export)."""
    full = _tensors()
    root = tmp_path_factory.mktemp("ckpt")
    st = root / "st"
    st.mkdir()
    names = list(full)
    shards = [names[:4], names[4:]]
    weight_map = {}
    for i, part in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        kiln.safetensors.torch.save_file({k: full[k] for k in part}, str(st / fname))
        weight_map.update({k: fname for k in part})
    (st / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    klnt = str(root / "m.klnt")
    kiln.save_file(full, klnt)
    gguf = str(root / "m.gguf")
    env = klnt_env()
    r = subprocess.run([klnt_cli(), "export", "--to", "gguf", "-o", gguf, klnt],
                       capture_output=True, env=env)
    assert r.returncode == 0, r.stderr
    return full, {"safetensors": str(st), "klnt": klnt, "gguf": gguf}


@pytest.fixture
def runtimes(monkeypatch):
    """The stand-ins importable as vllm and sglang for one test, then gone again (with the
    loader classes kiln made from them)."""
    monkeypatch.syspath_prepend(STANDINS)
    yield
    for name in list(sys.modules):
        if name.split(".")[0] in ("vllm", "sglang"):
            del sys.modules[name]
    import kiln.sglang as ks
    import kiln.vllm as kv

    kv._loader = ks._loader = None


def _vllm_model(where, rank=0, size=2, extra=None, **toy):
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig
    from vllm.model_executor.model_loader import get_model

    cfg = VllmConfig(model_config=ModelConfig(model=where, model_factory=lambda: Toy(
                         rank, size, **toy)),
                     device_config=DeviceConfig("cpu"),
                     load_config=LoadConfig(load_format="kiln",
                                            model_loader_extra_config=extra or {}))
    return get_model(vllm_config=cfg)


# --- vLLM ------------------------------------------------------------------------------------


def test_entry_point_is_declared_and_discovered(runtimes, tmp_path, caplog):
    """pyproject.toml's entry point, as an installed distribution would carry it, found by
    vLLM's load_general_plugins through importlib.metadata; it registers "kiln" once."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]
    assert eps["vllm.general_plugins"] == {"kiln": "kiln.vllm:register"}
    info = tmp_path / "kiln_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in
                                             eps["vllm.general_plugins"].items()))
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        import vllm.plugins
        from vllm.model_executor import model_loader

        assert "kiln" not in model_loader._LOAD_FORMAT_TO_MODEL_LOADER
        with caplog.at_level(logging.INFO):
            vllm.plugins.load_general_plugins()
            vllm.plugins.plugins_loaded = False
            vllm.plugins.load_general_plugins()  # a second process' worth: no re-register
    finally:
        sys.path.remove(str(tmp_path))
    import kiln.vllm

    assert model_loader._LOAD_FORMAT_TO_MODEL_LOADER["kiln"] is kiln.vllm.KilnModelLoader
    assert not [r for r in caplog.records if "already registered" in r.getMessage()]


def test_installed_package_carries_the_entry_point():
    """The installed kiln (scripts/test.sh's pip stage, KILN_TEST_INSTALLED=1) declares the
    plugin in its metadata; from the build tree there is no distribution to ask."""
    from importlib import metadata

    try:
        dist = metadata.distribution("kiln")
    except metadata.PackageNotFoundError:
        dist = None
    installed = dist is not None and os.path.realpath(str(dist.locate_file("kiln/__init__.py"))) \
        == os.path.realpath(kiln.__file__)
    if not installed:
        if os.environ.get("KILN_TEST_INSTALLED"):
            pytest.fail(f"KILN_TEST_INSTALLED is set but kiln comes from {kiln.__file__}, not "
                        f"an installed distribution")
        pytest.skip("kiln is imported from the build tree, not an installed distribution")
    eps = [ep for ep in dist.entry_points if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in eps] == [("kiln", "kiln.vllm:register")]
    assert eps[0].load() is kiln.vllm.register


def test_get_model_loader_gives_kiln(runtimes, caplog):
    import kiln.vllm
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    with pytest.raises(ValueError, match="Load format `kiln` is not supported"):
        get_model_loader(LoadConfig(load_format="kiln"))  # nothing registered yet
    cls = kiln.vllm.register()
    with caplog.at_level(logging.WARNING):
        assert kiln.vllm.register() is cls and kiln.vllm.KilnModelLoader is cls
    assert not caplog.records  # registered once: no "will be overwritten" warning
    loader = get_model_loader(LoadConfig(load_format="KILN"))  # vLLM lower-cases it
    assert type(loader) is cls and cls.__module__ == "kiln.vllm"
    assert loader.options["window"] == 256 << 20 and loader.options["group"] is False


@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "klnt"])
@pytest.mark.parametrize("rank", [0, 1])
def test_toy_model_filled_bit_exactly(runtimes, checkpoints, fmt, rank, caplog):
    import kiln.vllm

    full, paths = checkpoints
    kiln.vllm.register()
    with caplog.at_level(logging.INFO, logger="vllm.kiln"):
        model = _vllm_model(paths[fmt], rank, 2, extra={"window": "2M", "threads": 2})
    assert not model.training
    _expect_filled(model, full, rank, 2)
    done = [r.getMessage() for r in caplog.records if r.name == "vllm.kiln"]
    assert len(done) == 1 and f"{len(full)} tensors" in done[0] and "GB/s" in done[0]


def test_unfilled_parameters_are_named(runtimes, checkpoints):
    import kiln.vllm

    _, paths = checkpoints
    kiln.vllm.register()
    with pytest.raises(ValueError, match=r"Following weights were not initialized from "
                                         r"checkpoint: \['model.layers.1.bias'\]"):
        _vllm_model(paths["klnt"], bias=True)


def test_a_tensor_the_model_does_not_have_fails_in_its_load_weights(runtimes, checkpoints,
                                                                   tmp_path):
    import kiln.vllm

    full, _ = checkpoints
    p = str(tmp_path / "more.klnt")
    kiln.save_file(dict(full, **{"stray.weight": torch.ones(2)}), p)
    kiln.vllm.register()
    with pytest.raises(KeyError, match="stray.weight"):
        _vllm_model(p)


@pytest.mark.parametrize("extra, message", [
    ({"windw": 1}, r"unknown option 'windw' in model_loader_extra_config \(kiln's are: group, "
                   r"source, threads, verify, window\)"),
    ({"threads": 0}, r"'threads' \(model_loader_extra_config\) must be 1 to 16, not 0"),
    ({"threads": "many"}, r"'threads' \(model_loader_extra_config\) must be an integer"),
    ({"window": "12Q"}, r"'window' \(model_loader_extra_config\) must be a byte count"),
    ({"window": "1M"}, r"'window' \(model_loader_extra_config\) must be at least 2 MiB"),
    ({"verify": "perhaps"}, r"'verify' \(model_loader_extra_config\) must be true or false"),
    ({"source": ""}, r"'source' \(model_loader_extra_config\) must be a path or URL"),
])
def test_bad_options_are_refused_by_name(runtimes, extra, message):
    import kiln.vllm
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    kiln.vllm.register()
    with pytest.raises(ValueError, match=message):
        get_model_loader(LoadConfig(load_format="kiln", model_loader_extra_config=extra))


def test_options_from_the_dict_first_then_the_environment(runtimes, monkeypatch):
    import kiln.vllm
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    kiln.vllm.register()
    monkeypatch.setenv("KILN_LOADER_WINDOW", "3M")
    monkeypatch.setenv("KILN_LOADER_VERIFY", "yes")
    monkeypatch.setenv("KILN_LOADER_THREADS", "3")
    o = get_model_loader(LoadConfig(load_format="kiln",
                                    model_loader_extra_config={"threads": 5})).options
    assert (o["window"], o["verify"], o["threads"]) == (3 << 20, True, 5)
    monkeypatch.setenv("KILN_LOADER_THREADS", "99")
    with pytest.raises(ValueError, match=r"'threads' \(KILN_LOADER_THREADS\) must be 1 to 16"):
        get_model_loader(LoadConfig(load_format="kiln"))


def test_source_option_and_a_missing_model(runtimes, checkpoints, tmp_path):
    import kiln.vllm

    full, paths = checkpoints
    kiln.vllm.register()
    # source= wins over the model name (the runtime's config names something else).
    model = _vllm_model("not/a/hub-id", extra={"source": paths["gguf"]})
    _expect_filled(model, full, 0, 2)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no weights in .*empty"):
        _vllm_model(str(empty))


def test_verify_option_checks_digests(runtimes, checkpoints, tmp_path):
    import kiln.vllm

    full, paths = checkpoints
    kiln.vllm.register()
    # kiln.save_file's file carries its digest table: checked as it loads
    _expect_filled(_vllm_model(paths["klnt"], extra={"verify": True}), full, 0, 2)
    p = str(tmp_path / "m.klnt")
    kiln.save_file(full, p, digests=False)
    with pytest.raises(kiln.Error, match="klnt digest"):  # no digests: says how to make them
        _vllm_model(p, extra={"verify": True})
    with kiln.open(p) as d:
        d.write_digests()
    _expect_filled(_vllm_model(p, extra={"verify": True}), full, 0, 2)


def test_hub_ids_go_through_vllms_download_helper(runtimes, checkpoints, monkeypatch):
    import kiln.vllm
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader import get_model_loader, weight_utils

    full, paths = checkpoints
    calls = []

    def download(model, cache_dir, allow_patterns, revision=None, ignore_patterns=None):
        calls.append((model, cache_dir, allow_patterns, revision, ignore_patterns))
        return paths["safetensors"]

    monkeypatch.setattr(weight_utils, "download_weights_from_hf", download)
    kiln.vllm.register()
    loader = get_model_loader(LoadConfig(load_format="kiln", download_dir="/cache"))
    mc = ModelConfig(model="org/model", revision="abc", model_factory=lambda: Toy(1, 2))
    loader.download_model(mc)
    assert calls == [("org/model", "/cache", ["*.safetensors", "*.gguf", "*.klnt"], "abc",
                      ["original/**/*"])]
    model = Toy(1, 2)
    loader.load_weights(model, mc)
    _expect_filled(model, full, 1, 2)


GROUP_WORKER = textwrap.dedent("""
    import datetime, json, logging, os, sys
    import torch, torch.distributed as dist
    sys.path.insert(0, os.environ["KILN_TEST_STANDINS"])
    sys.path.insert(0, os.environ["KILN_TEST_HERE"])
    import kiln.vllm, test_runtimes as T
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method="file://" + os.environ["KILN_TEST_RDV"],
                            rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    seen, real = [], kiln.torch.iter_load
    def spy(*a, **k):
        it = real(*a, **k)
        seen.append(it)
        return it
    kiln.torch.iter_load = spy
    logs = []
    handler = logging.Handler()
    handler.emit = lambda r: logs.append(r.getMessage())
    logging.getLogger("vllm.kiln").addHandler(handler)
    logging.getLogger("vllm.kiln").setLevel(logging.INFO)
    kiln.vllm.register()
    model = T._vllm_model(sys.argv[1], rank, 2, extra={"group": True, "window": "2M"})
    full = kiln.torch.load(sys.argv[1])
    T._expect_filled(model, full, rank, 2)
    it = seen[0]
    json.dump({"read": it.bytes_read, "received": it.bytes_received, "total": it.total_bytes,
               "logs": logs}, open(sys.argv[2], "w"))
    # Both done before either tears the group down: gloo aborts a rank whose peer closed the
    # connection under it (seen under ASan, where one rank's checks ran slower).
    dist.barrier()
    dist.destroy_process_group()
    # The results are written: leave without the interpreter's teardown, in which torch 1.13's
    # gloo objects were once seen to abort ("terminate called without an active exception",
    # exit -6, out0.json and out1.json both complete) on a loaded machine.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def test_group_option_reads_once_between_two_ranks(checkpoints, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    _, paths = checkpoints
    script = tmp_path / "worker.py"
    script.write_text(GROUP_WORKER)
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), KILN_TEST_RDV=str(tmp_path / "rdv"),
                   KILN_TEST_STANDINS=STANDINS, KILN_TEST_HERE=HERE)
        procs.append(subprocess.Popen(
            [sys.executable, str(script), paths["klnt"], str(tmp_path / f"out{rank}.json")],
            env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    out = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    # Each byte read by one rank: the two reads add up to the payload once.
    assert out[0]["read"] + out[1]["read"] == out[0]["total"] == out[1]["total"]
    assert out[0]["received"] == out[1]["read"] and out[1]["received"] == out[0]["read"]
    # Progress on rank 0 only.
    assert len(out[0]["logs"]) == 1 and "GB/s" in out[0]["logs"][0] and out[1]["logs"] == []


# --- SGLang ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "klnt"])
def test_sglang_takes_the_class_as_load_format(runtimes, checkpoints, fmt):
    import kiln.sglang
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import get_model_loader

    full, paths = checkpoints
    cls = kiln.sglang.KilnModelLoader
    assert kiln.sglang.KilnModelLoader is cls and cls.__module__ == "kiln.sglang"
    # SGLang's form: the options as a JSON string, parsed by its LoadConfig.
    lc = LoadConfig(load_format=cls, model_loader_extra_config='{"window": "3MiB"}')
    loader = get_model_loader(lc)
    assert type(loader) is cls and loader.options["window"] == 3 << 20
    mc = ModelConfig(paths[fmt], dtype="float32", model_factory=lambda: Toy(1, 2))
    loader.download_model(mc)
    model = loader.load_model(model_config=mc, device_config=DeviceConfig("cpu"))
    assert not model.training
    _expect_filled(model, full, 1, 2)


def test_sglang_refuses_kiln_as_a_string_and_hub_ids_without_its_helper(runtimes, checkpoints):
    import kiln.sglang
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import get_model_loader

    with pytest.raises(ValueError, match="'kiln' is not a valid LoadFormat"):
        LoadConfig(load_format="kiln")  # SGLang's own rule: hence the class (docs/python.md)
    loader = get_model_loader(LoadConfig(load_format=kiln.sglang.KilnModelLoader))
    with pytest.raises(FileNotFoundError, match="org/model is not a local path or URL"):
        loader.download_model(ModelConfig("org/model"))
    with pytest.raises(ValueError, match="unknown option 'group_size'"):
        get_model_loader(LoadConfig(load_format=kiln.sglang.KilnModelLoader,
                                    model_loader_extra_config={"group_size": 2}))
