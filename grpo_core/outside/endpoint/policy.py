"""What the policy endpoint samples from, and what a finished episode becomes: a training row.

``EnginePolicy`` serves one sampler engine in this process (``VLLMSampler``) or a `grpo serve` server's client
(``ServerSampler``), one call at a time (an in-process vLLM engine is not thread-safe). ``episode_rows`` turns
finished episodes into rollout rows with the multi-turn columns, as the inbox takes them (``grpo_core.pipeline.inbox``):
the tokens trained on are the tokens sampled, the environment's out of the loss.
"""
from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from grpo_core.data.schemas import RESPONSE_MASK, sample_rows
from grpo_core.outside.endpoint.recorder import FinishedEpisode
from grpo_core.outside.endpoint.sampling import SamplingRequest, sample_once
from grpo_core.pipeline.inbox import OUTSIDE_SAMPLER
from grpo_core.engine.rollout.sampler import Sample


class EnginePolicy:
    def __init__(self, engine: Any, max_model_len: int):
        self.engine = engine
        self.max_model_len = max_model_len
        self._lock = threading.Lock()

    def sample(self, prompt_ids: list[int], request: SamplingRequest) -> tuple[list[Sample], int]:
        with self._lock:
            return sample_once(self.engine, prompt_ids, request), self.engine.version


def episode_rows(groups: list[list[FinishedEpisode]], first_group_id: int = 0) -> pa.Table:
    """Rollout rows of finished episodes, one group per list (the episodes of one task the environment compared):
    the fixed rollout columns, ``response_mask`` (the policy's tokens 1, the rest 0), ``reward`` (the episode's),
    and ``episode_id`` / ``episode_turns`` (each turn's role, token span and text, as JSON): an inbox item's rows."""
    prompts = [{"prompt_id": -1, "prompt_token_ids": group[0].prompt_ids} for group in groups]
    for group in groups:
        if any(e.prompt_ids != group[0].prompt_ids for e in group):
            raise ValueError(f"episodes {[e.episode_id for e in group]} are one group but start from different "
                             "prompts")
    episodes = [e for group in groups for e in group]
    table = sample_rows(0, prompts, [[e.episode for e in group] for group in groups], first_group_id, 0,
                        OUTSIDE_SAMPLER)
    table = table.set_column(table.schema.get_field_index("policy_version"), "policy_version",
                             pa.array([e.policy_version for e in episodes], pa.int64()))
    extra = {RESPONSE_MASK: pa.array([e.episode.mask for e in episodes], pa.list_(pa.int8())),
             "reward": pa.array([e.episode.reward for e in episodes], pa.float64()),
             "episode_id": pa.array([e.episode_id for e in episodes], pa.string()),
             "episode_turns": pa.array([e.episode.turns_json() for e in episodes], pa.string())}
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table
