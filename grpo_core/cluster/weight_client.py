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

    def _all(self, method: str, args_per_sampler: list[tuple]) -> None:
        ray.get([getattr(s, method).remote(*args) for s, args in zip(self.samplers, args_per_sampler)])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        per_sampler = []
        for k in range(len(self.samplers)):
            info = dict(init_info)
            if "rank_offset" in info:
                info["rank_offset"] = init_info["rank_offset"] + k * self.workers_per_sampler
            per_sampler.append((info,))
        self._all("wt_init", per_sampler)

    def start_weight_update(self) -> None:
        self._all("wt_start", [()] * len(self.samplers))

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all("wt_update", [(update_info,)] * len(self.samplers))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("wt_finish", [(self.version,)] * len(self.samplers))
