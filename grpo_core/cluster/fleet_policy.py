"""The policy endpoint's policy during a run: each call goes to a live sampler of the fleet, in turn.

A sampler actor runs one call at a time, so an endpoint call waits behind a rollout on the same sampler (and a
rollout behind it); the version in the answer is the one that sampled it. After the actors are recreated
(``Engines.recreate``) calls go to the new fleet.
"""
from __future__ import annotations

import itertools

from grpo_core.cluster.calls import gather
from grpo_core.cluster.engines import Engines
from grpo_core.outside.endpoint.sampling import SamplingRequest
from grpo_core.engine.rollout.sampler import Sample


class FleetPolicy:
    def __init__(self, engines: Engines, max_model_len: int):
        self.engines = engines
        self.max_model_len = max_model_len
        self._turn = itertools.count()

    def sample(self, prompt_ids: list[int], request: SamplingRequest) -> tuple[list[Sample], int]:
        live = self.engines.samplers.live()
        actor = live[next(self._turn) % len(live)]
        return gather([actor.complete.remote(prompt_ids, request)], [actor], "complete", self.engines.names)[0]
