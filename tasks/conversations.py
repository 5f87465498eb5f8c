"""Conversations task (SFT runs): the iteration's conversations become its training batch, scored.parquet.

An SFT iteration samples and scores nothing: its batch is the next ``sft.conversations_per_iteration`` conversations
of the train set in the run's seeded epoch order (``PromptStream``: a pure function of seed and iteration, so a
resumed run takes the same ones with no cursor to save), with the loss on their assistant turns. A batch file already
complete for the iteration (a resume) is reused.
"""
from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.data.schemas import conversation_rows
from tasks.context import RunContext
from tasks.results import RolloutResult, ScoreResult
from tasks.rollout import policy_lengths

BATCH_FILE = "scored.parquet"


@task(name="conversations", task_run_name="conversations-{iteration:06d}", cache_policy=NONE)
def conversations(ctx: RunContext, iteration: int) -> tuple[RolloutResult, ScoreResult]:
    """The batch file and what it holds, as the results of a rollout and its scoring would say it (the iteration's
    metrics row is the same shape for every run; the rollout's lengths are the assistant tokens trained on)."""
    version = ctx.cfg.window.sampling_version(iteration)
    done = ctx.store.entry(iteration, BATCH_FILE)
    if done is not None and done.meta.get("policy_version") == version:
        return (RolloutResult.from_meta(BATCH_FILE, done.rows, True, done.meta),
                ScoreResult(BATCH_FILE, done.rows, True, dict(done.meta["metrics"])))
    started = time.perf_counter()
    table = conversation_rows(iteration, ctx.train_prompts.batch(iteration), version)
    lengths = policy_lengths(table)
    rollout = RolloutResult(name=BATCH_FILE, rows=table.num_rows, reused=False, seconds=time.perf_counter() - started,
                            policy_version=version, tokens=int(sum(lengths)),
                            response_length_mean=sum(lengths) / len(lengths), response_length_max=max(lengths),
                            truncated_frac=0.0)
    metrics = {"reward_mean": None, "kept_frac": 1.0}
    ctx.store.put_table(iteration, BATCH_FILE, table, meta={**rollout.meta(), "metrics": metrics})
    return rollout, ScoreResult(BATCH_FILE, table.num_rows, False, metrics)
