"""vLLM's weight-sync client protocol over our sampler actors.

A vLLM trainer-side weight-transfer engine (in learner rank 0's actor) drives the inference side through a client
with four calls: init, start, update, finish. This client makes each call on every sampler actor at once (each
passes it to all of its vLLM workers) and waits for all of them. The workers of sampler k sit at ranks
``1 + k * workers_per_sampler ..`` of the transfer group (the trainer is rank 0), so the init info is adjusted per
sampler.
"""
from __future__ import annotations

from typing import Any

import ray


class SamplerWeightClient:
    def __init__(self, samplers: list, workers_per_sampler: int):
        self.samplers = list(samplers)
        self.workers_per_sampler = workers_per_sampler
        self.version: int | None = None  # what the samplers serve after the next finish

    @property
    def workers(self) -> int:
        """vLLM workers on the inference side of the transfer group."""
        return len(self.samplers) * self.workers_per_sampler

    def _all(self, calls: list) -> None:
        """Wait for one call (an object ref) per sampler."""
        ray.get(calls)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        calls = []
        for k, sampler in enumerate(self.samplers):
            info = dict(init_info)
            if "rank_offset" in info:
                info["rank_offset"] = init_info["rank_offset"] + k * self.workers_per_sampler
            calls.append(sampler.wt_init.remote(info))
        self._all(calls)

    def start_weight_update(self) -> None:
        self._all([s.wt_start.remote() for s in self.samplers])

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all([s.wt_update.remote(update_info) for s in self.samplers])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all([s.wt_finish.remote(self.version) for s in self.samplers])
