"""vLLM worker extension: receives new policy weights inside the vLLM worker.

vLLM loads this class into its worker (``worker_extension_cls``) and we reach it with ``llm.collective_rpc``.
On CPU, vLLM repacks linear weights for its GEMM kernels at load time, so a plain ``model.load_weights`` after the
first load gives wrong outputs; ``reload_weights`` re-runs the loader's post-processing. Two more CPU-only details
(measured, see STACK.md): the full state dict must be sent (a partial update of a fused qkv/gate_up layer corrupts
it), and with tied embeddings the packed lm_head keeps the OLD embedding unless it is rebuilt.

The receipt: every transport ends in the model's ``load_weights`` (our in-process and gloo/files paths as vLLM's own
NCCL and IPC engines), so that one method, wrapped on the model object, digests every tensor the loader is handed
between ``grpo_receipt_begin`` and ``grpo_receipt_end`` (``grpo_core.engine.weights_digest``). The packed CPU copies are
not readable (vLLM drops the plain weight after packing), which is why the digest is taken at the loader's door.
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch


class WeightReceiver:
    """Mixed into vLLM's worker class; ``self`` is the worker (it has ``model_runner`` and ``reload_weights``)."""

    def grpo_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        weights = list(named_tensors)
        # vLLM's layer-wise reload warns "Failed to load weights" for every layer that received nothing: the rotary
        # embedding (no weights) and, with tied embeddings, the lm_head (its weight IS the embedding, which did
        # arrive; the packed copy is rebuilt below). Both are expected on every sync, so that one logger is quieted;
        # the receipt (grpo_receipt_begin/end) is the check that the sampler was handed the learner's weights.
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level = reload_log.level
        reload_log.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=iter(weights))
        finally:
            reload_log.setLevel(level)
        refresh_tied_lm_head(self.model_runner.get_model())
        return len(weights)

    def grpo_receipt_begin(self) -> None:
        """Start digesting what the model's loader is handed (the wrapper is installed on first use)."""
        model = self.model_runner.get_model()
        if not hasattr(model, "_grpo_receipt"):
            wrap_load_weights(model)
        model._grpo_receipt = []

    def grpo_receipt_end(self) -> str | None:
        """The digest (JSON, so that it crosses a server's ``/collective_rpc`` too) of every tensor loaded since
        ``grpo_receipt_begin``; None when no receipt was open."""
        from grpo_core.engine.weights_digest import WeightsDigest

        model = self.model_runner.get_model()
        parts, model._grpo_receipt = getattr(model, "_grpo_receipt", None), None
        return None if parts is None else WeightsDigest.merge(parts).to_json()


def wrap_load_weights(model: torch.nn.Module) -> None:
    """Make ``model.load_weights`` digest the tensors it is handed while a receipt is open (``_grpo_receipt`` a
    list), before loading them: a transport's buffers are reused once the loader returns."""
    from grpo_core.engine.weights_digest import WeightsDigest

    load = model.load_weights

    def load_weights(weights, *args, **kwargs):
        receipt = getattr(model, "_grpo_receipt", None)
        if receipt is None:
            return load(weights, *args, **kwargs)
        weights = list(weights)
        receipt.append(WeightsDigest.of(weights))
        return load(weights, *args, **kwargs)

    model.load_weights = load_weights
    model._grpo_receipt = None


def refresh_tied_lm_head(model: torch.nn.Module) -> None:
    """After new weights reached a tied model on CPU: rebuild the lm_head's packed GEMM copy of the embedding
    (also called by our weight-transfer engines, ``grpo_core.weights.gloo``). A no-op elsewhere."""
    from vllm.platforms import current_platform

    lm_head = getattr(model, "lm_head", None)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if lm_head is None or not tied or not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
