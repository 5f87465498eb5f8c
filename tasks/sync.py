"""Sync task: push the learner's weights to the sampler, and the version check that triggers it."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.cluster.ray_cluster import call
from tasks.context import RunContext


@task(name="sync", cache_policy=NONE)
def sync(ctx: RunContext) -> dict[str, Any]:
    return call(ctx.worker.sync)


def ensure_synced(ctx: RunContext, expected_learner_version: int) -> dict[str, Any] | None:
    """Re-sync when the sampler serves other weights than the learner holds (e.g. a restarted sampler came back
    with its original weights). A learner behind the expected version lost its state: that is an error, never a
    silent restart from scratch."""
    sampler_version, learner_version = call(ctx.worker.versions)
    if learner_version != expected_learner_version:
        raise RuntimeError(f"learner is at policy version {learner_version}, expected {expected_learner_version}: "
                           "the learner lost its state (restarted actor?)")
    if sampler_version != learner_version:
        return sync(ctx)
    return None
