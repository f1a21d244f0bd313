# SPDX-License-Identifier: MIT
"""kiln.vllm: kiln as a vLLM model loader, ``vllm serve MODEL --load-format kiln``.

Installing kiln (``pip install .``) declares the entry point ``vllm.general_plugins: kiln =
kiln.vllm:register``; vLLM calls every general plugin in each of its processes, so the loader is
registered wherever a model is loaded. ``register()`` may also be called by hand (it is
idempotent). The loader streams the checkpoint through ``kiln.torch.iter_load`` into the
model's own ``load_weights`` (vLLM's weight loaders narrow each tensor for their
tensor-parallel rank and copy it into the parameters), with at most ``window`` bytes read ahead,
and fails naming any parameter the checkpoint left unfilled, as vLLM's default loader does.

Options come from ``--model-loader-extra-config`` (a JSON object), then from KILN_LOADER_*
environment variables, then defaults; an unknown key is refused by name:

    threads  reader threads per batch, 1 to 16 (KILN_LOADER_THREADS; default: kiln's)
    window   bytes read ahead at most, an int or "256M" (KILN_LOADER_WINDOW; 256 MiB)
    verify   check every byte against the model's digests (KILN_LOADER_VERIFY; false)
    group    read the checkpoint once between the ranks, over vLLM's CPU group
             (KILN_LOADER_GROUP; false)
    source   where the weights are, if not the model's directory: a path or a URL
             (KILN_LOADER_SOURCE)

The model is a local directory (its model.safetensors.index.json, else its *.safetensors,
*.gguf or *.klnt files), a file, a URL, or a hub id, downloaded by vLLM's own helper into its
cache. See docs/python.md ("vLLM").
"""

import logging
import threading

from . import _runtime

__all__ = ["register", "KilnModelLoader"]

_lock = threading.Lock()
_loader = None
_WHO = "kiln (vLLM)"


def register():
    """Register kiln's loader with vLLM as load format "kiln" and return its class. vLLM calls
    this in every process through the ``vllm.general_plugins`` entry point; later calls (and
    calls by hand) return the same class without registering again."""
    global _loader
    with _lock:
        if _loader is None:
            from vllm.model_executor.model_loader import register_model_loader

            _loader = register_model_loader("kiln")(_make_loader())
        return _loader


def __getattr__(name):
    # kiln.vllm.KilnModelLoader: the class, registered (vLLM imported only when asked).
    if name == "KilnModelLoader":
        return register()
    raise AttributeError(f"module 'kiln.vllm' has no attribute {name!r}")


def _download(model, model_config, load_config):
    """A hub id, through vLLM's own download helper, into its cache; the local folder. The
    helper fetches the files of the first pattern that matches any; the safetensors index
    comes through its own helper where vLLM has one."""
    from vllm.model_executor.model_loader import weight_utils

    folder = weight_utils.download_weights_from_hf(
        model, load_config.download_dir, list(_runtime.WEIGHT_PATTERNS),
        revision=model_config.revision, ignore_patterns=load_config.ignore_patterns)
    index = getattr(weight_utils, "download_safetensors_index_file_from_hf", None)
    if index is not None:
        index(model, "model.safetensors.index.json", load_config.download_dir,
              model_config.revision)
    return folder


def _world_group():
    """vLLM's CPU (gloo) group of every rank, or None before vLLM set one up."""
    try:
        from vllm.distributed import get_world_group

        return get_world_group().cpu_group
    except (ImportError, AssertionError):
        return None


def _make_loader():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class KilnModelLoader(_runtime.Loader, BaseModelLoader):
        """vLLM's loader for load format "kiln": the checkpoint streamed by kiln.torch.iter_load
        into model.load_weights (module kiln.vllm)."""

        who = _WHO
        logger = logging.getLogger("vllm.kiln")

        def model_name(self, model_config):
            return model_config.model

        def download(self, model, model_config):
            return _download(model, model_config, self.load_config)

        def world_group(self):
            return _world_group()

        def load_weights(self, model, model_config):
            self.fill(model, model_config, self.where(model_config))

    KilnModelLoader.__module__ = __name__
    return KilnModelLoader
