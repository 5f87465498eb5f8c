"""Evaluate task: responses on the eval split (greedy by default), scored for accuracy -> eval.parquet."""
from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.pipeline.scoring import score_table, with_rewards
from tasks.context import RunContext


@task(name="evaluate", task_run_name="evaluate-{iteration:06d}", cache_policy=NONE)
def evaluate(ctx: RunContext, iteration: int) -> dict[str, Any]:
    ev = ctx.cfg.eval
    table, gen = ctx.engines.generate_eval(iteration, ctx.eval_prompts, ev.greedy, ev.samples_per_prompt)
    results, metrics = score_table(table, ctx.scorer)
    scored = with_rewards(table, results)
    accuracy = metrics.get("reward_accuracy_mean", metrics["reward_mean"])
    ctx.store.put_table(iteration, "eval.parquet", scored,
                        meta={"accuracy": accuracy, "greedy": ev.greedy, "policy_version": gen["policy_version"]})
    best, worst = _examples(scored)
    return {"accuracy": accuracy, "reward_mean": metrics["reward_mean"], "rows": scored.num_rows,
            "greedy": ev.greedy, "seconds": gen["seconds"], "policy_version": gen["policy_version"],
            "best": best, "worst": worst}


def _examples(scored, count: int = 3) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``count`` highest- and lowest-reward completions (for the run's eval artifact in the Prefect UI)."""
    cols = [c for c in ("messages", "prompt_text", "response_text", "gt_answer", "reward") if c in scored.column_names]
    rows = [dict(zip(cols, values)) for values in zip(*(scored.column(c).to_pylist() for c in cols))]
    rows = [{"prompt": _question(r), "response": r.get("response_text", ""),
             "answer": r.get("gt_answer", ""), "reward": r["reward"]} for r in rows if r.get("reward") is not None]
    ranked = sorted(rows, key=lambda r: r["reward"], reverse=True)
    return ranked[:count], ranked[::-1][:count]


def _question(row: dict[str, Any]) -> str:
    """What a reader wants to see of the prompt: the last user turn (the rendered prompt_text starts with the chat
    template and the system prompt, which would fill the table's column)."""
    users = [m.get("content", "") for m in row.get("messages") or [] if m.get("role") == "user"]
    return users[-1] if users else row.get("prompt_text", "")
