"""Rollout task: the samplers generate G responses per prompt; the rows become rollouts.parquet.

Each iteration's rollout has one policy version that must sample it (``cfg.window.sampling_version``: the
learner's version before the iteration, or s iterations earlier in async RL). A rollout file already complete for this
iteration with that version (a resumed run) is reused, not sampled again; samplers serving any other version are
an error, never a silent change of the data.
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.data.schemas import RESPONSE_MASK, ROLLOUT_SCHEMA
from grpo_core.envs.episode import ENV_ERROR, ENV_TIMEOUT, TRUNCATED_ENDS

from tasks.context import RunContext
from grpo_core.engine.results import Sampled
from tasks.inbox import INBOX_FILE, inbox_groups
from tasks.results import RolloutResult


def policy_lengths(table) -> list[int]:
    """Tokens per row that the policy sampled: the response length, less an episode's environment tokens."""
    if RESPONSE_MASK in table.column_names:
        return [sum(mask) for mask in table.column(RESPONSE_MASK).to_pylist()]
    return table.column("response_length").to_pylist()


def episode_stats(table) -> dict:
    """The multi-turn metrics of a rollout file with episode columns (none for single-turn rollouts)."""
    if "num_turns" not in table.column_names:
        return {}
    n = table.num_rows
    calls = table.column("tool_calls").to_pylist()
    ends = table.column("episode_end").to_pylist()
    return {"turns_mean": sum(table.column("num_turns").to_pylist()) / n, "tool_calls_mean": sum(calls) / n,
            "tool_call_frac": sum(c > 0 for c in calls) / n,
            "tool_errors": sum(table.column("tool_errors").to_pylist()),
            "episode_truncated_frac": sum(e in TRUNCATED_ENDS for e in ends) / n,
            "env_errors": sum(e in (ENV_ERROR, ENV_TIMEOUT) for e in ends)}


@task(name="rollout", task_run_name="rollout-{iteration:06d}-r{round_}", cache_policy=NONE)
def rollout(ctx: RunContext, iteration: int, round_: int = 0, name: str = "rollouts.parquet",
            sample: bool = True) -> RolloutResult:
    """Round ``round_`` of the iteration's rollout into ``name``. ``sample=False``: every group comes from the inbox
    (an outside source; a short batch is padded when scored, not sampled): an empty file, the inbox's rows measured."""
    cfg = ctx.cfg
    version = cfg.window.sampling_version(iteration)
    done = ctx.store.entry(iteration, name)
    if done is not None and done.meta.get("policy_version") == version:
        return RolloutResult.from_meta(name, done.rows, True, done.meta)
    if not sample:
        prompts = []
    else:
        prompts = ctx.train_prompts.batch(iteration, round_)
        if round_ == 0:  # groups taken from the inbox replace the iteration's last prompts
            prompts = prompts[: len(prompts) - inbox_groups(ctx, iteration)]
    if prompts:
        serving = ctx.engines.samplers.versions()
        if any(v != version for v in serving):
            raise RuntimeError(
                f"iteration {iteration}'s rollout must be sampled with policy version {version} "
                f"(rollout.max_staleness={cfg.rollout.max_staleness}), but the samplers serve {serving} and "
                f"{ctx.store.url(f'iter-{iteration:06d}/{name}')} holds no complete rollout of that version")
        table, sampled = ctx.engines.samplers.rollout(iteration, prompts, group_offset=round_ * len(prompts))
        measured = table
    else:  # the whole batch came through the inbox (an Atropos trainer): nothing to sample, its rows measured
        table = ROLLOUT_SCHEMA.empty_table()
        measured = ctx.store.get_table(iteration, INBOX_FILE)
        sampled = Sampled(seconds=0.0, policy_version=version, samplers_used=0, samplers_lost=0,
                          samplers_live=len(ctx.engines.samplers.live_ids()))
    lengths = policy_lengths(measured)
    result = RolloutResult(
        name=name, rows=table.num_rows, reused=False, seconds=sampled.seconds, policy_version=sampled.policy_version,
        tokens=int(sum(lengths)), response_length_mean=sum(lengths) / len(lengths),
        response_length_max=max(lengths), truncated_frac=sum(measured.column("truncated").to_pylist()) / len(lengths),
        samplers_used=sampled.samplers_used, samplers_lost=sampled.samplers_lost, samplers_live=sampled.samplers_live,
        **episode_stats(measured), **(ctx.train_prompts.pool.metrics(iteration) if ctx.train_prompts.pool else {}))
    ctx.store.put_table(iteration, name, table, meta=result.meta())
    return result
