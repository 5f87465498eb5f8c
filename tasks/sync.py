"""Sync task: push the learner's weights to the sampler, and the version check that triggers it."""
from __future__ import annotations

import time
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import RunContext


@task(name="sync", cache_policy=NONE)
def sync(ctx: RunContext, check: tuple[int, str] | None = None) -> dict[str, Any]:
    """Push weights; with ``check=(iteration, rollout file)`` also measure sampler/learner logprob agreement."""
    out = ctx.engines.sync()
    rows = ctx.cfg.weights.check_samples
    if check is not None and rows > 0:
        started = time.perf_counter()
        out.update(ctx.engines.check_sync(check[0], check[1], rows))
        out["check_seconds"] = time.perf_counter() - started
    return out


def ensure_synced(ctx: RunContext, expected_learner_version: int) -> dict[str, Any] | None:
    """Re-sync when the sampler serves other weights than the learner holds (e.g. a restarted sampler came back
    with its original weights). A learner behind the expected version lost its state: that is an error, never a
    silent restart from scratch."""
    sampler_version, learner_version = ctx.engines.versions()
    if learner_version != expected_learner_version:
        raise RuntimeError(f"learner is at policy version {learner_version}, expected {expected_learner_version}: "
                           "the learner lost its state (restarted actor?)")
    if sampler_version != learner_version:
        return sync(ctx)
    return None
