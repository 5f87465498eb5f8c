"""Model rewards in Ray actors (``reward.models``): each model loaded once per flow run in ``replicas`` actors of
``cluster.reward_resources``, like the samplers, and asked for every score stage's batch.

``RewardModels.clients()`` gives the scorer one ``ModelReward`` per model whose ``score`` splits a batch into
contiguous shares, one per replica, and joins the verdicts in order. A replica that dies is restarted by Ray and the
call it was running retried there (``RESTARTS`` times; then the score call fails with the error); a judge server
that does not answer is the judge's business (``RemoteJudge``: retries, then rows unscored with the reason).
"""
from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grpo_core.cluster.ray_cluster import actor_env, actor_output_file, on_loopback, placed_group
from grpo_core.config import GRPOConfig, ModelRewardConfig
from grpo_core.logs import redirect_process_output
from grpo_core.rewards.models import ModelReward, ModelVerdict, RewardInput, make_model_reward


RESTARTS = 2


class RewardModelHost:
    """What one reward actor runs: a model reward built by the factory, its output in the run's logs/."""

    def __init__(self, cfg: ModelRewardConfig, threads: int, output_file: str | None):
        if output_file is not None:
            redirect_process_output(output_file)
        self.reward = make_model_reward(cfg, threads=threads)

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        return self.reward.score(rows)

    def close(self) -> None:
        self.reward.close()


class _Replicas(ModelReward):
    """One model's actors seen as one ModelReward."""

    def __init__(self, name: str, actors: list[Any]):
        self.name, self.actors = name, actors

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        if not rows:
            return []
        share = -(-len(rows) // len(self.actors))
        calls = [actor.score.remote(rows[i:i + share])
                 for actor, i in zip(self.actors, range(0, len(rows), share))]
        try:
            return [v for part in ray.get(calls) for v in part]
        except ray.exceptions.RayActorError as error:
            raise RuntimeError(f"reward.models.{self.name}: a reward actor died while scoring ({error})") from error


class RewardModels:
    """The reward actors of a run, started together (placement groups) and stopped together."""

    def __init__(self, cfg: GRPOConfig):
        res = cfg.cluster.reward_resources
        threads = res.torch_threads or os.cpu_count() or 1
        host = ray.remote(RewardModelHost)
        self.groups, self._replicas = [], {}
        for name, model in cfg.reward.models.items():
            group = placed_group(res, model.replicas, f"grpo-{cfg.run_name}-reward-{name}", "reward")
            self.groups.append(group)
            actors = [host.options(
                num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources or None, max_concurrency=1,
                # A dead replica is started again (its model reloaded) and the call it was running retried there.
                max_restarts=RESTARTS, max_task_retries=RESTARTS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                     placement_group_bundle_index=i),
                runtime_env={"env_vars": actor_env(threads, on_loopback(cfg))},
            ).remote(model, threads, actor_output_file(cfg, f"reward-{name}-{i}")) for i in range(model.replicas)]
            self._replicas[name] = _Replicas(name, actors)
        # Loaded before the first score stage: a model folder that cannot be read fails the run here.
        ray.get([a.__ray_ready__.remote() for r in self._replicas.values() for a in r.actors])

    def clients(self) -> dict[str, ModelReward]:
        return dict(self._replicas)

    def close(self) -> None:
        for replicas in self._replicas.values():
            for actor in replicas.actors:
                ray.kill(actor, no_restart=True)
        for group in self.groups:
            remove_placement_group(group)
        self._replicas, self.groups = {}, []
