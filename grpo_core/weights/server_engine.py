"""The weight-transfer backend of `grpo serve` (``grpo``): files and gloo broadcast through one vLLM engine.

A vLLM server is started with one weight-transfer backend and keeps it for life, but a trainer may reach it either
way, so this engine takes both on vLLM's own routes (``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``):

* files: ``update_info = {"path": URL, "storage_options": {...}}``; the worker reads every ``*.safetensors`` of
  the published version (``weights/v-N/`` in the run store: a local folder or any fsspec URL such as ``s3://``).
  This is the transport that crosses hosts and clusters: the server needs only read access to the store.
* broadcast: ``/init_weight_transfer_engine`` with the gloo init info, then ``update_info`` = the packed-bucket
  metadata of ``grpo_core.weights.gloo`` (the trainer side is the gloo trainer engine, unchanged).

Either way the load goes through vLLM's layerwise reload with the CPU rules (full state dict, tied lm_head rebuilt).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_core.weights.gloo import GlooWeightTransferEngine, GlooWeightTransferUpdateInfo

BACKEND = "grpo"


@dataclass
class ServerUpdateInfo(GlooWeightTransferUpdateInfo):
    """Either ``path`` (files) or the per-round gloo metadata (``names``/``dtype_names``/``shapes``)."""

    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    path: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)


def read_safetensors_folder(path: str, storage_options: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of every ``*.safetensors`` file directly under ``path`` (local folder or fsspec URL)."""
    import fsspec
    from safetensors.torch import load as load_bytes

    fs, root = fsspec.core.url_to_fs(path, **storage_options)
    files = sorted(f for f in fs.ls(root, detail=False) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files to load")
    return [item for f in files for item in load_bytes(fs.cat_file(f)).items()]


class ServerWeightTransferEngine(GlooWeightTransferEngine):
    """vLLM worker side of ``grpo``: files when the update names a path, otherwise the gloo broadcast."""

    update_info_cls = ServerUpdateInfo

    def receive_weights(self, update_info: ServerUpdateInfo) -> None:
        if update_info.path is None:
            if not update_info.names:
                raise ValueError("update_info names neither a path (files) nor tensors (broadcast)")
            super().receive_weights(update_info)
            return
        import time

        started = time.perf_counter()
        weights = read_safetensors_folder(update_info.path, update_info.storage_options)
        self._load(weights)
        self.last_receive = {"seconds": time.perf_counter() - started, "tensors": float(len(weights))}


def register() -> None:
    """Register ``grpo`` with vLLM's worker-side factory (idempotent). The trainer side of a broadcast to a server
    is the gloo trainer engine; files need no trainer engine."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "ServerWeightTransferEngine")
