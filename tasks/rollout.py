"""Rollout task: the sampler generates G responses per prompt and writes rollouts.parquet."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import RunContext


@task(name="rollout", cache_policy=NONE)
def rollout(ctx: RunContext, iteration: int, round_: int = 0) -> dict[str, Any]:
    prompts = ctx.train_prompts.batch(iteration, round_)
    name = "rollouts.parquet" if not ctx.cfg.algo.filter_groups else f"rollouts-r{round_}.parquet"
    return ctx.engines.rollout(iteration, prompts, name=name, seed_offset=round_ * len(prompts))
