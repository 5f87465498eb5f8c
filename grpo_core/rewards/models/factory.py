"""The one place that turns a ``reward.models`` entry into its class."""
from __future__ import annotations

from grpo_core.config import ModelRewardConfig
from grpo_core.rewards.models.base import ModelReward


def make_model_reward(cfg: ModelRewardConfig, *, threads: int | None = None) -> ModelReward:
    judge = dict(template=cfg.template, verdict=cfg.verdict, score_range=tuple(cfg.score_range),
                 max_tokens=cfg.max_tokens)
    if cfg.kind == "classifier":
        from grpo_core.rewards.models.classifier import ClassifierReward

        return ClassifierReward(cfg.path, batch_size=cfg.batch_size, max_length=cfg.max_length,
                                normalize=cfg.normalize, threads=threads)
    if cfg.kind == "judge":
        from grpo_core.rewards.models.judge import VLLMJudge

        return VLLMJudge(cfg.path, max_model_len=cfg.max_length, **judge)
    from grpo_core.rewards.models.judge import RemoteJudge

    return RemoteJudge(cfg.url, served_model=cfg.served_model, timeout_s=cfg.timeout_s, retries=cfg.retries,
                       max_parallel=cfg.batch_size, **judge)
