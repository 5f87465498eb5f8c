"""Train task: one policy update on scored.parquet, data-parallel over the learner ranks; writes train.json."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import RunContext
from tasks.results import TrainResult


@task(name="train", task_run_name="train-{iteration:06d}", cache_policy=NONE)
def train(ctx: RunContext, iteration: int) -> TrainResult:
    """The merged metrics and when the update ran (``ctx.clock()``): in async RL this runs in a thread beside the
    next rollout, and the flow's timeline needs when it really ran."""
    started = ctx.clock()
    step = ctx.engines.learners.train(iteration)
    ctx.store.put_json(iteration, "train.json", step.to_json(), meta={"policy_version": step.policy_version})
    return TrainResult(step, started, ctx.clock())
