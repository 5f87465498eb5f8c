"""Train task: one policy update on scored.parquet inside the learner actor."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import RunContext


@task(name="train", cache_policy=NONE)
def train(ctx: RunContext, iteration: int) -> dict[str, Any]:
    return ctx.engines.train(iteration)
