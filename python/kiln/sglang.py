# SPDX-License-Identifier: MIT
"""kiln.sglang: kiln as an SGLang model loader.

SGLang has no registry of loaders by name: a loader class passed as ``load_format`` is what
its ``get_model_loader`` instantiates (a string must be one of SGLang's own LoadFormat
names, so ``--load-format kiln`` on its command line is refused by SGLang). So kiln's loader
is given as a class, from Python:

    import sglang, kiln.sglang
    engine = sglang.Engine(model_path="/models/llama", load_format=kiln.sglang.KilnModelLoader,
                           model_loader_extra_config='{"window": "512M"}')

SGLang's plugin hook (the ``sglang.srt.plugins`` entry points) patches functions and does not
register loaders; kiln declares none. The loader builds the model as SGLang's default loader
does (its dtype, on the target device), streams the checkpoint through
``kiln.torch.iter_load`` into ``model.load_weights``, runs the quantization methods'
post-processing and returns the model in eval mode. Options and where the weights are: as
kiln.vllm (docs/python.md, "SGLang").
"""

import contextlib
import logging
import threading

from . import _runtime

__all__ = ["KilnModelLoader"]

_lock = threading.Lock()
_loader = None
_WHO = "kiln (SGLang)"


def loader():
    """kiln's SGLang loader class (SGLang imported on the first call)."""
    global _loader
    with _lock:
        if _loader is None:
            _loader = _make_loader()
        return _loader


def __getattr__(name):
    if name == "KilnModelLoader":
        return loader()
    raise AttributeError(f"module 'kiln.sglang' has no attribute {name!r}")


def _download(model, model_config, load_config):
    """A hub id, through SGLang's own download helper, into its cache; the local folder."""
    try:
        from sglang.srt.model_loader.weight_utils import download_weights_from_hf
    except ImportError:
        raise FileNotFoundError(
            f"{_WHO}: {model} is not a local path or URL, and this SGLang has no "
            f"download_weights_from_hf to fetch it: pass a local directory") from None
    return download_weights_from_hf(model, load_config.download_dir,
                                    list(_runtime.WEIGHT_PATTERNS), revision=model_config.revision,
                                    ignore_patterns=load_config.ignore_patterns)


def _world_group():
    """SGLang's CPU (gloo) group of every rank, or None before SGLang set one up."""
    try:
        from sglang.srt.distributed import get_world_group

        return get_world_group().cpu_group
    except (ImportError, AssertionError):
        return None


@contextlib.contextmanager
def _on(device):
    """Build on ``device`` where torch can (2.0+ has device contexts); elsewhere the caller
    moves the model after."""
    import torch

    if hasattr(torch.device, "__enter__"):
        with device:
            yield True
    else:
        yield False


def _make_loader():
    import torch
    from sglang.srt.model_loader.loader import BaseModelLoader, _initialize_model
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    class KilnModelLoader(_runtime.Loader, BaseModelLoader):
        """SGLang's loader given as ``load_format=``: the checkpoint streamed by
        kiln.torch.iter_load into model.load_weights (module kiln.sglang)."""

        who = _WHO
        logger = logging.getLogger("sglang.kiln")

        def model_name(self, model_config):
            return model_config.model_path

        def download(self, model, model_config):
            return _download(model, model_config, self.load_config)

        def world_group(self):
            return _world_group()

        def load_model(self, *, model_config, device_config):
            where = self.where(model_config)  # a missing model fails before one is built
            target = torch.device(device_config.device)
            with set_default_torch_dtype(model_config.dtype):
                with _on(target) as placed:
                    model = _initialize_model(model_config, self.load_config)
            if not placed:
                model = model.to(target)
            self.fill(model, model_config, where)
            # As SGLang's default loader: quantized layers repack their weights once loaded.
            for _, module in model.named_modules():
                method = getattr(module, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(module)
            return model.eval()

    KilnModelLoader.__module__ = __name__
    return KilnModelLoader
