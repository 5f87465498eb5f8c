"""One call of the policy endpoint on one engine: the caller's sampling settings, applied as given."""
from __future__ import annotations

from typing import Any

from grpo_core.outside.endpoint.requests import SamplingRequest
from grpo_core.engine.rollout.sampler import Sample


def sample_once(engine: Any, prompt_ids: list[int], request: SamplingRequest) -> list[Sample]:
    """``request.n`` samples of one prompt from a ``VLLMSampler`` or a ``ServerSampler``."""
    if request.temperature == 0.0:
        return engine.generate_greedy([prompt_ids], max_tokens=request.max_tokens) * request.n
    return engine.generate([prompt_ids], n=request.n, max_tokens=request.max_tokens, temperature=request.temperature,
                           top_p=request.top_p, seeds=None if request.seed is None else [request.seed])[0]
