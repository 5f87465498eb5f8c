"""Model rewards in Ray actors (``reward.models``): each model loaded once per flow run in ``replicas`` actors of
``cluster.reward_resources``, like the samplers, and asked for every score stage's batch.

``RewardModels.clients()`` gives the scorer one ``ModelReward`` per model whose ``score`` splits a batch into
contiguous shares, one per replica, and joins the verdicts in order (``ModelActors``). A replica that dies is
restarted by Ray and the call it was running retried there; a judge server that does not answer is the judge's
business (``RemoteJudge``: retries, then rows unscored with the reason).
"""
from __future__ import annotations

from grpo_core.cluster.model_actors import ModelActors
from grpo_core.config import GRPOConfig, ModelRewardConfig
from grpo_core.run.logs import redirect_process_output
from grpo_core.rewards.models import ModelReward, ModelVerdict, RewardInput, make_model_reward


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

    def __init__(self, actors: ModelActors):
        self.actors = actors

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        return self.actors.call("score", rows)


class RewardModels:
    """The reward actors of a run, started together (placement groups) and stopped together."""

    def __init__(self, cfg: GRPOConfig):
        self._replicas: dict[str, _Replicas] = {}
        try:
            for name, model in cfg.reward.models.items():
                self._replicas[name] = _Replicas(ModelActors(cfg, RewardModelHost, (model,), model.replicas,
                                                             f"reward-{name}"))
        except BaseException:
            self.close()
            raise

    def clients(self) -> dict[str, ModelReward]:
        return dict(self._replicas)

    def close(self) -> None:
        for replicas in self._replicas.values():
            replicas.actors.close()
        self._replicas = {}
