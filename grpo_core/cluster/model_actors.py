"""Replicas of one model in Ray actors, started together (a placement group) and asked as one: what the reward models
and the distillation teacher share.

A batch is split into contiguous shares, one per replica, and the answers joined in order. A replica that dies is
restarted by Ray and the call it was running retried there (``RESTARTS`` times; then the call fails naming the model).
"""
from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_core.cluster.ray_cluster import actor_env, actor_output_file, on_loopback, placed_group
from grpo_core.config import GRPOConfig

RESTARTS = 2


class ModelActors:
    """``replicas`` actors of ``host`` (a class built as ``host(*args, threads, output_file)``) on
    ``cluster.reward_resources`` each; ``call(method, rows)`` splits ``rows`` between them."""

    def __init__(self, cfg: GRPOConfig, host: type, args: tuple, replicas: int, label: str):
        res = cfg.cluster.reward_resources
        threads = res.torch_threads or os.cpu_count() or 1
        self.label = label
        self.group = placed_group(res, replicas, f"grpo-{cfg.run_name}-{label}", "reward")
        remote = ray.remote(host)
        try:
            self.actors = [remote.options(
                num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources or None, max_concurrency=1,
                # A dead replica is started again (its model reloaded) and the call it was running retried there.
                max_restarts=RESTARTS, max_task_retries=RESTARTS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                                     placement_group_bundle_index=i),
                runtime_env={"env_vars": actor_env(threads, on_loopback(cfg))},
            ).remote(*args, threads, actor_output_file(cfg, f"{label}-{i}")) for i in range(replicas)]
            # Loaded before the first score stage: a model folder that cannot be read fails the run here.
            ray.get([a.__ray_ready__.remote() for a in self.actors])
        except BaseException:
            self.close()
            raise

    def call(self, method: str, rows: list) -> list:
        """``method`` of the replicas on contiguous shares of ``rows``, the answers joined in order."""
        if not rows:
            return []
        share = -(-len(rows) // len(self.actors))
        calls = [getattr(actor, method).remote(rows[i:i + share])
                 for actor, i in zip(self.actors, range(0, len(rows), share))]
        try:
            return [v for part in ray.get(calls) for v in part]
        except ray.exceptions.RayActorError as error:
            raise RuntimeError(f"{self.label}: an actor died while answering {method} ({error})") from error

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)
        self.actors, self.group = [], None
