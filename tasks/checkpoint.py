"""Checkpoint tasks: start one (the learner copies its state and writes it in the background) and commit it.

A checkpoint counts once ``commit`` has written its manifest and ``latest.json``. Only one is written at a time:
starting the next one first commits the one before.
"""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core import checkpoint
from tasks.context import PendingCheckpoint, RunContext


@task(name="checkpoint", task_run_name="checkpoint-{iteration:06d}", cache_policy=NONE)
def begin_checkpoint(ctx: RunContext, iteration: int) -> dict[str, Any]:
    """Snapshot the state after ``iteration``; training goes on while it is written."""
    committed = commit_pending(ctx, wait=True)
    out = ctx.engines.checkpoint_begin(iteration)
    ctx.pending_checkpoint = PendingCheckpoint(iteration=iteration, policy_version=out["policy_version"],
                                               snapshot_seconds=out["snapshot_seconds"])
    return {"snapshot_seconds": out["snapshot_seconds"], "committed": committed}


@task(name="commit-checkpoint", cache_policy=NONE)
def commit_checkpoint(ctx: RunContext, wait: bool = False) -> dict[str, Any] | None:
    """Commit the pending checkpoint if its files are written (``wait``: wait for them)."""
    return commit_pending(ctx, wait)


def commit_pending(ctx: RunContext, wait: bool) -> dict[str, Any] | None:
    pending = ctx.pending_checkpoint
    if pending is None:
        return None
    if pending.written is None:
        pending.written = ctx.engines.checkpoint_result(wait)
        if pending.written is None:
            return None  # still being written
    ref = checkpoint.commit(ctx.store, pending.iteration, pending.policy_version, pending.written["files"],
                            ctx.cfg.checkpoint.keep_last)
    ctx.pending_checkpoint = None
    ctx.status.latest_checkpoint = ref.name
    written = pending.written
    print(f"checkpoint {ref.name} committed (policy version {ref.policy_version}, {written['bytes'] / 2**20:.1f} "
          f"MiB; copy {pending.snapshot_seconds:.2f}s, background write {written['write_seconds']:.2f}s)")
    return {"checkpoint": ref.path, "iteration": ref.iteration, "policy_version": ref.policy_version,
            "bytes": written["bytes"], "snapshot_seconds": pending.snapshot_seconds,
            "write_seconds": written["write_seconds"]}


@task(name="restore", cache_policy=NONE)
def restore(ctx: RunContext, ref: checkpoint.CheckpointRef) -> dict[str, Any]:
    """Every learner rank loads a committed checkpoint (read from the run store), then the samplers get its
    weights."""
    return ctx.engines.restore(ref)


@task(name="save-final", cache_policy=NONE)
def save_final(ctx: RunContext) -> dict[str, Any]:
    """The trained policy in HF format under ``final/`` (manifest last)."""
    return ctx.engines.save_final()
