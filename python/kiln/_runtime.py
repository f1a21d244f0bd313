# SPDX-License-Identifier: MIT
"""What kiln's runtime loaders (kiln.vllm, kiln.sglang) share: their options, read from the
runtime's ``model_loader_extra_config`` dict first and from KILN_LOADER_* environment variables
only where the dict says nothing; the checkpoint files of a model directory; the stream of
weights with progress on rank 0; the check that every parameter was filled."""

import glob
import logging
import os
import time

log = logging.getLogger("kiln")

# option -> (environment fallback, parser, default, what it is)
OPTIONS = {
    "threads": ("KILN_LOADER_THREADS", "int", None, "reader threads per batch, 1 to 16"),
    "window": ("KILN_LOADER_WINDOW", "bytes", 256 << 20,
               "bytes read ahead at most, 2 MiB or more (an int, or with a K/M/G suffix)"),
    "verify": ("KILN_LOADER_VERIFY", "bool", False,
               "check every byte against the model's digests (klnt digest)"),
    "group": ("KILN_LOADER_GROUP", "bool", False,
              "read the checkpoint once between the ranks (torch.distributed, gloo)"),
    "source": ("KILN_LOADER_SOURCE", "str", None,
               "where the weights are, if not the model's directory: a path or a URL"),
}


def _parse(name, kind, value, where):
    if kind == "str":
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise ValueError(f"kiln loader: option {name!r} ({where}) must be a path or URL, "
                             f"not {value!r}")
        return str(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"kiln loader: option {name!r} ({where}) must be true or false, "
                         f"not {value!r}")
    if kind == "bytes" and isinstance(value, str):
        text = value.strip().upper().removesuffix("B").removesuffix("I")
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        if not digits.isdigit():
            raise ValueError(f"kiln loader: option {name!r} ({where}) must be a byte count, "
                             f"not {value!r}")
        value = int(digits) * scale
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"kiln loader: option {name!r} ({where}) must be an integer, "
                         f"not {value!r}")
    if kind == "int" and not 1 <= value <= 16:
        raise ValueError(f"kiln loader: option {name!r} ({where}) must be 1 to 16, not {value}")
    if kind == "bytes" and value < 2 << 20:
        raise ValueError(f"kiln loader: option {name!r} ({where}) must be at least 2 MiB, "
                         f"not {value}")
    return value


def options(extra, who):
    """The loader's options: ``extra`` (the runtime's model_loader_extra_config: a dict, or
    None) first, then the environment, then the defaults. An unknown key is refused by name."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise TypeError(f"{who}: model_loader_extra_config must be a dict, not "
                        f"{type(extra).__name__}")
    unknown = sorted(str(k) for k in extra if k not in OPTIONS)
    if unknown:
        known = ", ".join(sorted(OPTIONS))
        raise ValueError(f"{who}: unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)} in model_loader_extra_config "
                         f"(kiln's are: {known})")
    out = {}
    for name, (env, kind, default, _what) in OPTIONS.items():
        if name in extra and extra[name] is not None:
            out[name] = _parse(name, kind, extra[name], "model_loader_extra_config")
        elif os.environ.get(env):
            out[name] = _parse(name, kind, os.environ[env], env)
        else:
            out[name] = default
    return out


# Which files of a model directory hold the weights, in the order formats are looked for: a
# sharded safetensors checkpoint by its index (every shard of it, none other), loose safetensors
# files, GGUF, KLNT.
WEIGHT_PATTERNS = ("*.safetensors", "*.gguf", "*.klnt")


def weight_files(where):
    """What iter_load reads for a model at ``where``: a URL or a file as it is; for a
    directory, its safetensors index if there is one, else its files of the first format found
    (a list). Raises FileNotFoundError naming what was looked for."""
    from . import _kiln

    where = str(where)
    if _kiln.is_url(where) or os.path.isfile(where):
        return where
    if not os.path.isdir(where):
        raise FileNotFoundError(f"kiln loader: {where} is neither a directory, a file nor a URL")
    index = os.path.join(where, "model.safetensors.index.json")
    if os.path.isfile(index):
        return index
    for pattern in WEIGHT_PATTERNS:
        found = sorted(glob.glob(os.path.join(glob.escape(where), pattern)))
        if found:
            return found
    raise FileNotFoundError(f"kiln loader: no weights in {where} (looked for "
                            f"model.safetensors.index.json, {', '.join(WEIGHT_PATTERNS)})")


def locate(model, source, download):
    """Where the weights are: the ``source`` option if given, else the runtime's model name
    when it is a URL or an existing path, else what ``download(model)`` returns (the
    runtime's own hub download, into its cache)."""
    from . import _kiln

    if source is not None:
        return source
    model = str(model)
    if _kiln.is_url(model) or os.path.exists(model):
        return model
    return download(model)


def group_of(opts, world_group):
    """The process group to read once between (the ``group`` option), or None.
    ``world_group()`` gives the runtime's CPU (gloo) group of every rank, or None where the
    runtime has none; torch.distributed's default group otherwise."""
    if not opts["group"]:
        return None
    import torch.distributed as dist

    pg = world_group()
    if pg is not None:
        return pg
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("kiln loader: option 'group' needs torch.distributed initialized "
                         "(every rank loading the same model)")
    return dist.group.WORLD


def rank0():
    """Whether this process reports: rank 0 of torch.distributed, or no group at all."""
    try:
        import torch.distributed as dist

        return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    except ImportError:
        return True


def weights(where, opts, *, group=None, logger=log, who="kiln"):
    """iter_load of the model's weights (CPU tensors, each owning its memory) with the
    options, and progress in bytes and GB/s logged on rank 0 (every 5 s, and a line at the
    end of a complete stream)."""
    from . import torch as kt

    start = time.monotonic()
    last = [start]
    report = rank0()

    def progress(done, total):
        now = time.monotonic()
        if report and now - last[0] >= 5:
            last[0] = now
            logger.info("%s: %.2f of %.2f GB, %.2f GB/s", who, done / 1e9, total / 1e9,
                        done / 1e9 / max(now - start, 1e-9))

    it = kt.iter_load(weight_files(where), window_bytes=opts["window"], threads=opts["threads"],
                      verify=opts["verify"], group=group, progress=progress)
    try:
        yield from it
    finally:
        it.close()
    if report:
        took = time.monotonic() - start
        logger.info("%s: %d tensors, %.2f GB in %.2f s (%.2f GB/s)%s", who, it.tensors,
                    it.total_bytes / 1e9, took, it.total_bytes / 1e9 / max(took, 1e-9),
                    ", every byte verified" if opts["verify"] else "")


def parameter_names(model):
    """The names vLLM expects filled: every parameter, taken before loading."""
    return {name for name, _ in model.named_parameters()}


def check_filled(expected, loaded):
    """vLLM's rule after model.load_weights: every expected parameter named in what it
    returns, else a ValueError listing those no checkpoint tensor filled (``loaded`` None:
    the model does not say, nothing to check)."""
    if loaded is None:
        return
    missing = set(expected) - set(loaded)
    if missing:
        raise ValueError(f"Following weights were not initialized from checkpoint: "
                         f"{sorted(missing)}")


class Loader:
    """What kiln's loaders share, mixed in before the runtime's own BaseModelLoader (whose
    ``__init__(load_config)`` it calls): the options, read when the runtime picks the loader;
    where the weights are; ``download_model``; and ``fill``, the stream into
    ``model.load_weights`` with the check that every parameter was filled. Each runtime's class
    sets ``who`` and ``logger`` and says how its config names the model, how it downloads a hub
    id and which CPU group its ranks share."""

    who = "kiln"
    logger = log

    def __init__(self, load_config):
        super().__init__(load_config)
        self.options = options(load_config.model_loader_extra_config, self.who)

    def model_name(self, model_config):
        raise NotImplementedError

    def download(self, model, model_config):
        raise NotImplementedError

    def world_group(self):
        return None

    def where(self, model_config):
        return locate(self.model_name(model_config), self.options["source"],
                      lambda m: self.download(m, model_config))

    def download_model(self, model_config):
        weight_files(self.where(model_config))

    def fill(self, model, model_config, where):
        """model.load_weights over the stream of the weights at ``where``."""
        expected = parameter_names(model)
        loaded = model.load_weights(weights(where, self.options,
                                            group=group_of(self.options, self.world_group),
                                            logger=self.logger, who=self.who))
        # As vLLM's default loader: a quantized model's parameters differ from the
        # checkpoint's names, so only an unquantized one is checked.
        if getattr(model_config, "quantization", None) is None:
            check_filled(expected, loaded)
