"""Evaluate task: responses on the eval split (greedy by default), scored for accuracy -> eval.parquet."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.pipeline.scoring import score_table, with_rewards
from tasks.context import RunContext


@task(name="evaluate", cache_policy=NONE)
def evaluate(ctx: RunContext, iteration: int) -> dict[str, Any]:
    ev = ctx.cfg.eval
    table, gen = ctx.engines.generate_eval(iteration, ctx.eval_prompts, ev.greedy, ev.samples_per_prompt)
    results, metrics = score_table(table, ctx.scorer, ctx.cfg.rollout.max_new_tokens)
    scored = with_rewards(table, results)
    accuracy = metrics.get("reward_accuracy_mean", metrics["reward_mean"])
    ctx.store.put_table(iteration, "eval.parquet", scored,
                        meta={"accuracy": accuracy, "greedy": ev.greedy, "policy_version": gen["policy_version"]})
    return {"accuracy": accuracy, "reward_mean": metrics["reward_mean"], "rows": scored.num_rows,
            "greedy": ev.greedy, "seconds": gen["seconds"], "policy_version": gen["policy_version"]}
