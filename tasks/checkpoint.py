"""Checkpoint tasks: start one (the learner copies its state and writes it in the background) and commit it.

A checkpoint counts once ``commit`` has written its manifest and ``latest.json``. Only one is written at a time:
starting the next one first commits the one before. Besides the learner's files, the flow writes the difficulty
pool's state (``prompt_pool.json``, with ``data.sampler: difficulty_pool``) into the same folder and manifest.
"""
from __future__ import annotations

import hashlib
import json
import time

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.run import checkpoint
from grpo_core.run.checkpoint import CommittedCheckpoint, PendingCheckpoint
from grpo_core.pipeline.difficulty_pool import PoolState
from grpo_core.engine.results import FinalPolicy, Restored
from tasks.context import RunContext

POOL_FILE = "prompt_pool.json"


@task(name="checkpoint", task_run_name="checkpoint-{iteration:06d}", cache_policy=NONE)
def begin_checkpoint(ctx: RunContext, iteration: int) -> PendingCheckpoint:
    """Commit the checkpoint before (waiting for its files), then snapshot the state after ``iteration``;
    training goes on while it is written."""
    commit_pending(ctx, wait=True)
    pending = ctx.pending_checkpoint = ctx.engines.learners.checkpoint_begin(iteration)
    pool = ctx.train_prompts.pool
    if pool is not None:  # the state after drawing this iteration's prompts: the next draw needs nothing else
        data = json.dumps(pool.state(iteration).to_json(), sort_keys=True).encode()
        ctx.store.put_bytes(f"{checkpoint.checkpoint_path(iteration)}/{POOL_FILE}", data)
        pending.flow_files[POOL_FILE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return pending


@task(name="commit-checkpoint", cache_policy=NONE)
def commit_checkpoint(ctx: RunContext, wait: bool = False) -> CommittedCheckpoint | None:
    """Commit the pending checkpoint if its files are written (``wait``: wait for them)."""
    return commit_pending(ctx, wait)


def commit_pending(ctx: RunContext, wait: bool) -> CommittedCheckpoint | None:
    pending = ctx.pending_checkpoint
    if pending is None or not ctx.engines.learners.poll(pending, wait):
        return None  # none, or still being written
    done = pending.commit(ctx.store, ctx.cfg.checkpoint.keep_last)
    ctx.pending_checkpoint = None
    ctx.status.latest_checkpoint = done.ref.name
    print(f"checkpoint {done.ref.name} committed (policy version {done.ref.policy_version}, "
          f"{done.bytes / 2**20:.1f} MiB; copy {done.snapshot_seconds:.2f}s, background write "
          f"{done.write_seconds:.2f}s)")
    return done


@task(name="restore", cache_policy=NONE)
def restore(ctx: RunContext, ref: checkpoint.CheckpointRef) -> Restored:
    """Every learner rank loads a committed checkpoint (read from the run store), then the samplers get its
    weights; the difficulty pool goes back to its state there."""
    started = time.perf_counter()
    ctx.engines.learners.restore(ref)
    ctx.engines.weights.sync()
    pool = ctx.train_prompts.pool
    if pool is not None:
        doc = ctx.store.get_json_file(f"{ref.path}/{POOL_FILE}")
        if doc is None:
            raise RuntimeError(f"{ctx.store.url(ref.path)} has no {POOL_FILE}: it was not written by a run with "
                               "data.sampler=difficulty_pool")
        pool.restore(PoolState.from_json(doc))
    return Restored(time.perf_counter() - started, ref.policy_version)


@task(name="save-final", cache_policy=NONE)
def save_final(ctx: RunContext) -> FinalPolicy:
    """The trained policy in HF format under ``final/`` (manifest last)."""
    return ctx.engines.learners.save_final()
