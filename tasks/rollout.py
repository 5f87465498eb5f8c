"""Rollout task: the samplers generate G responses per prompt; the rows become rollouts.parquet.

A rollout file already complete for this iteration and sampled with the policy version the samplers serve now
(a resumed run) is reused, not sampled again.
"""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from tasks.context import RunContext


@task(name="rollout", cache_policy=NONE)
def rollout(ctx: RunContext, iteration: int, round_: int = 0) -> dict[str, Any]:
    cfg = ctx.cfg
    name = "rollouts.parquet" if not cfg.algo.filter_groups else f"rollouts-r{round_}.parquet"
    version = cfg.policy_version_before(iteration)
    done = ctx.store.entry(iteration, name)
    if done is not None and done.meta.get("policy_version") == version:
        return {"name": name, "rows": done.rows, "reused": True, **done.meta}
    prompts = ctx.train_prompts.batch(iteration, round_)
    table, meta = ctx.engines.rollout(iteration, prompts, group_offset=round_ * len(prompts))
    lengths = table.column("response_length").to_pylist()
    meta.update({"tokens": int(sum(lengths)), "response_length_mean": sum(lengths) / len(lengths),
                 "response_length_max": max(lengths),
                 "truncated_frac": sum(table.column("truncated").to_pylist()) / len(lengths)})
    entry = ctx.store.put_table(iteration, name, table, meta=meta)
    return {"name": name, "rows": entry.rows, "reused": False, **meta}
