"""Sync task: push the learner's weights to the samplers, and the version check that triggers it."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import Opaque, RunContext
from tasks.endpoint import paused
from grpo_core.engine.results import SyncResult


def _sync_run_name() -> str:
    """The task run's name in the UI: ``sync-000042`` after iteration 42's training, plain ``sync`` otherwise."""
    from prefect.runtime import task_run

    iteration = task_run.parameters.get("iteration")
    return "sync" if iteration is None else f"sync-{iteration:06d}"


@task(name="sync", task_run_name=_sync_run_name, cache_policy=NONE)
def sync(ctx: RunContext, check: tuple[int, str] | None = None, iteration: int | None = None) -> SyncResult:
    """Push weights (after ``iteration``'s training, if given); with ``check=(iteration, rollout file)`` also
    check that every sampler was handed the learner's weights (by digest) and measure the logprob gap on some of
    that file's sequences of every sampler."""
    with paused(ctx, "the weights are being updated" + (f" after iteration {iteration}" if iteration is not None
                                                         else "")):
        synced = ctx.engines.weights.sync()
    rows = ctx.cfg.weights.check_samples
    if check is None or rows <= 0:
        return synced
    started = time.perf_counter()
    checked = ctx.engines.weights.check(check_rows(ctx, *check, rows))
    return replace(synced, tensors_checked=checked.tensors, gap=checked.gap,
                   check_seconds=time.perf_counter() - started)


def check_rows(ctx: RunContext, iteration: int, name: str, per_sampler: int
               ) -> dict[int, tuple[list[list[int]], list[int]]]:
    """For every live sampler, ``per_sampler`` sequences of an iteration's file of sampled rows (its rollout, or its
    inbox's when every group came from outside) as (sequences, prompt lengths): the ones it produced itself, or, for
    a sampler that drew none there (it replaced a dead one), another sampler's."""
    table = ctx.store.get_table(iteration, name).select(["sampler_id", "prompt_token_ids", "response_token_ids"])
    drawn: dict[int, tuple[list[list[int]], list[int]]] = {}
    for sid, prompt, response in zip(*(table.column(c).to_pylist() for c in table.column_names)):
        seqs, lens = drawn.setdefault(sid, ([], []))
        if len(seqs) < per_sampler:
            seqs.append(prompt + response)
            lens.append(len(prompt))
    fallback = drawn[min(drawn)]
    return {sid: drawn.get(sid, fallback) for sid in ctx.engines.samplers.live_ids()}


def ensure_synced(ctx: RunContext, expected_learner_version: int,
                  sync_stage: Callable[[RunContext], SyncResult] | None = None) -> SyncResult | None:
    """Re-sync when a sampler serves other weights than the learner holds (e.g. a restarted sampler came back
    with its original weights), through ``sync_stage`` (the flow's sync task with the run's retry policy; the
    plain task without one). A learner behind the expected version lost its state: that is an error, never a
    silent restart from scratch."""
    sampler_versions, learner_version = ctx.engines.samplers.versions(), ctx.engines.learners.version()
    if learner_version != expected_learner_version:
        raise RuntimeError(f"learner is at policy version {learner_version}, expected {expected_learner_version}: "
                           "the learner lost its state (restarted actor?)")
    if any(v != learner_version for v in sampler_versions):
        return (sync_stage or Opaque(sync))(ctx)
    return None
