"""In-process weight sync (colocated placement): the learner's tensors go straight into the sampler's worker.

No serialisation, no copy through a socket: vLLM's loader copies each tensor into its own (repacked) parameters.
With LoRA the adapter alone goes, through a temporary peft folder (``grpo_core.weights.lora``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from grpo_core.weights.transport import Ends, Published, Transport

if TYPE_CHECKING:
    from grpo_core.engine.rollout.sampler import VLLMSampler
    from grpo_core.engine.train.learner import Learner


def push_in_process(learner: "Learner", sampler: "VLLMSampler") -> dict[str, float]:
    started = time.perf_counter()
    weights = learner.named_weights()
    n_bytes = sum(t.numel() * t.element_size() for _, t in weights)
    sampler.load_weights(weights, version=learner.version)
    return {"seconds": time.perf_counter() - started, "tensors": float(len(weights)), "bytes": float(n_bytes),
            "version": float(learner.version)}


class InProcessTransport(Transport):
    """Each colocated actor's learner rank pushes into its own sampler."""

    kind = "inprocess"

    def publish(self, ends: Ends, keep_versions: list[int]) -> Published:
        from grpo_core.weights.lora import push_adapter_in_process

        push = push_adapter_in_process if ends.cfg.model.lora is not None else push_in_process
        out = push(ends.learner, ends.sampler)
        return Published(version=int(out["version"]), seconds=out["seconds"], bytes=out["bytes"])
