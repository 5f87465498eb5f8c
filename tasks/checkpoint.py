"""Checkpoint tasks: start one (the learner copies its state and writes it in the background) and commit it.

A checkpoint counts once ``commit`` has written its manifest and ``latest.json``. Only one is written at a time:
starting the next one first commits the one before. Besides the learner's files, the flow writes the difficulty
pool's state (``prompt_pool.json``, with ``data.sampler: difficulty_pool``) into the same folder and manifest.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core import checkpoint
from grpo_core.pipeline.difficulty_pool import PoolState
from tasks.context import PendingCheckpoint, RunContext

POOL_FILE = "prompt_pool.json"


@task(name="checkpoint", task_run_name="checkpoint-{iteration:06d}", cache_policy=NONE)
def begin_checkpoint(ctx: RunContext, iteration: int) -> dict[str, Any]:
    """Snapshot the state after ``iteration``; training goes on while it is written."""
    committed = commit_pending(ctx, wait=True)
    out = ctx.engines.checkpoint_begin(iteration)
    ctx.pending_checkpoint = PendingCheckpoint(iteration=iteration, policy_version=out["policy_version"],
                                               snapshot_seconds=out["snapshot_seconds"])
    pool = ctx.train_prompts.pool
    if pool is not None:  # the state after drawing this iteration's prompts: the next draw needs nothing else
        data = json.dumps(pool.state(iteration).to_json(), sort_keys=True).encode()
        ctx.store.put_bytes(f"{checkpoint.checkpoint_path(iteration)}/{POOL_FILE}", data)
        ctx.pending_checkpoint.flow_files[POOL_FILE] = {"bytes": len(data),
                                                       "sha256": hashlib.sha256(data).hexdigest()}
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
    ref = checkpoint.commit(ctx.store, pending.iteration, pending.policy_version,
                            {**pending.written["files"], **pending.flow_files}, ctx.cfg.checkpoint.keep_last)
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
    weights; the difficulty pool goes back to its state there."""
    out = ctx.engines.restore(ref)
    pool = ctx.train_prompts.pool
    if pool is not None:
        doc = ctx.store.get_json_file(f"{ref.path}/{POOL_FILE}")
        if doc is None:
            raise RuntimeError(f"{ctx.store.url(ref.path)} has no {POOL_FILE}: it was not written by a run with "
                               "data.sampler=difficulty_pool")
        pool.restore(PoolState.from_json(doc))
    return out


@task(name="save-final", cache_policy=NONE)
def save_final(ctx: RunContext) -> dict[str, Any]:
    """The trained policy in HF format under ``final/`` (manifest last)."""
    return ctx.engines.save_final()
