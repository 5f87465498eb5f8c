"""In-process weight sync (colocated placement): the learner's tensors go straight into the sampler's worker.

No serialisation, no copy through a socket: vLLM's loader copies each tensor into its own (repacked) parameters.
"""
from __future__ import annotations

import time

from grpo_core.rollout.sampler import VLLMSampler
from grpo_core.train.learner import Learner


def push_in_process(learner: Learner, sampler: VLLMSampler) -> dict[str, float]:
    started = time.perf_counter()
    weights = learner.named_weights()
    n_bytes = sum(t.numel() * t.element_size() for _, t in weights)
    sampler.load_weights(weights, version=learner.version)
    return {"seconds": time.perf_counter() - started, "tensors": float(len(weights)), "bytes": float(n_bytes),
            "version": float(learner.version)}
