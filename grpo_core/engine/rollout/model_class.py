"""vLLM's model class inspected in this process where there is no CUDA to keep uninitialised.

The first time vLLM meets a model architecture it inspects the class (which interfaces it implements) in a fresh
Python subprocess, so that importing the model's module cannot initialise CUDA in the caller, and caches the answer in
``VLLM_CACHE_ROOT/modelinfos``. That subprocess imports vLLM again: on 2 cores it was 15-18 s of a fresh clone's
first `make run` (`vLLM load 21.1s`, 4.0 s once the answer is cached), and again wherever the cache folder is new
(each clone, each CI machine). Without a CUDA device there is nothing to protect, and the engine runs in this process
anyway (the uni executor), so the class is imported here and handed to vLLM's public
``ModelRegistry.register_model``, which vLLM then inspects in this process.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


def inspect_in_process(model_path: str) -> list[str]:
    """Register the classes of ``model_path``'s architectures (its config.json) as imported ones; the architectures
    registered (none with a CUDA device, or where vLLM does not know the architecture: its own error follows)."""
    config = Path(model_path) / "config.json"
    if torch.cuda.is_available() or not config.is_file():
        return []
    from vllm import ModelRegistry

    registered = []
    for arch in json.loads(config.read_text()).get("architectures") or []:
        entry = ModelRegistry.models.get(arch)
        if entry is None:
            continue
        ModelRegistry.register_model(arch, entry.load_model_cls())
        registered.append(arch)
    return registered
