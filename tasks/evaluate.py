"""Evaluate task: responses on every named eval set (greedy and/or k samples per prompt), scored for accuracy with
the set's reward type -> ``eval-<name>.parquet`` per set, and the ``eval/<name>/...`` metrics."""
from __future__ import annotations

import json

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NONE

from grpo_core.pipeline.evaluation import GREEDY, SAMPLED, score_responses, set_metrics
from tasks.context import RunContext
from tasks.results import EvalResult


@task(name="evaluate", task_run_name="evaluate-{iteration:06d}", cache_policy=NONE)
def evaluate(ctx: RunContext, iteration: int) -> EvalResult:
    """``accuracy`` is the first set's (the run's ``eval_accuracy``); ``metrics`` holds every set's."""
    metrics: dict[str, float] = {}
    first: dict | None = None
    seconds, version = 0.0, None
    for eval_set in ctx.eval_sets:
        spec, scorer = eval_set.spec, ctx.eval_scorers.for_type(eval_set.spec.reward_type)
        tables: dict[str, pa.Table] = {}
        for mode in ([GREEDY] if spec.greedy else []) + ([SAMPLED] if spec.samples else []):
            table, gen = ctx.engines.samplers.generate_eval(iteration, eval_set.prompts, mode == GREEDY,
                                                            spec.samples or 1)
            tables[mode] = score_responses(table, scorer, mode)
            seconds, version = seconds + gen.seconds, gen.policy_version
        m = set_metrics(eval_set, tables.get(GREEDY), tables.get(SAMPLED))
        metrics.update(m)
        scored = pa.concat_tables(list(tables.values()), promote_options="default")
        accuracy = m[f"eval/{eval_set.name}/accuracy"]
        ctx.store.put_table(iteration, eval_set.file_name, scored,
                            meta={"accuracy": accuracy, "greedy": spec.greedy, "policy_version": version})
        if first is None:
            shown = tables[GREEDY] if GREEDY in tables else tables[SAMPLED]
            best, worst = _examples(shown, eval_set.questions)
            rewards = [r for r in shown.column("reward").to_pylist() if r is not None]
            first = {"accuracy": accuracy, "set": eval_set.name, "greedy": spec.greedy, "best": best, "worst": worst,
                     "rows": scored.num_rows, "reward_mean": sum(rewards) / len(rewards) if rewards else None}
    return EvalResult(**first, metrics=metrics, seconds=seconds, policy_version=version)


def _examples(scored, questions: dict[int, str], count: int = 3) -> tuple[list[dict], list[dict]]:
    """The ``count`` highest- and lowest-reward completions (for the run's eval artifact in the Prefect UI), each
    with its question (the last user turn; the rendered prompt_text would show the chat template and system prompt)."""
    cols = [c for c in ("prompt_id", "prompt_text", "response_text", "gt_answer", "reward", "episode_turns")
            if c in scored.column_names]
    rows = [dict(zip(cols, values)) for values in zip(*(scored.column(c).to_pylist() for c in cols))]
    rows = [{"prompt": questions.get(r.get("prompt_id"), r.get("prompt_text", "")),
             "response": r.get("response_text", ""), "answer": r.get("gt_answer", ""), "reward": r["reward"],
             **({"turns": _turns(r["episode_turns"])} if r.get("episode_turns") else {})}
            for r in rows if r.get("reward") is not None]
    ranked = sorted(rows, key=lambda r: r["reward"], reverse=True)
    return ranked[:count], ranked[::-1][:count]


def _turns(episode_turns: str) -> list[dict[str, str]]:
    """A multi-turn episode turn by turn (role, text, and the tool calls' errors), for the eval artifact."""
    turns = []
    for t in json.loads(episode_turns):
        errors = [c["error"] for c in t.get("tool_calls", []) if c.get("error")]
        turns.append({"role": t["role"], "text": t["text"], **({"errors": "; ".join(errors)} if errors else {})})
    return turns
