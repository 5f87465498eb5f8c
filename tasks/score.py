"""Score tasks: rewards (in the scorer's processes), advantages and the kept mask.

Without dynamic sampling, ``rollouts.parquet`` becomes ``scored.parquet``, the training batch. With dynamic sampling
(DAPO) every round is scored on its own (``rollouts-rK`` -> ``scored-rK``) and ``assemble`` builds the training batch
from exactly ``prompts_per_iteration`` groups: the ones the batch source's ``DynamicBatch`` kept (decided there, once),
then filler. If the rounds run out before the batch is full, it is
completed with dropped groups whose rows stay in the file with ``kept = False`` (no loss): nothing is dropped
silently and the learner always sees the configured batch size.
"""
from __future__ import annotations

import time

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NONE

from grpo_core.pipeline.difficulty_pool import GroupOutcome
from grpo_core.pipeline.distillation import with_teacher_signal
from grpo_core.pipeline.scoring import add_advantages, group_success, score_table, with_rewards
from grpo_core.run.storage import RunStore
from tasks.context import RunContext
from tasks.inbox import INBOX_FILE
from tasks.results import ScoreResult


def scored_name(rollout_name: str) -> str:
    return rollout_name.replace("rollouts", "scored", 1)


@task(name="score", task_run_name="score-{iteration:06d}", cache_policy=NONE)
def score(ctx: RunContext, iteration: int, rollout_name: str, group_success: bool = False) -> ScoreResult:
    """rollouts*.parquet -> scored*.parquet (reused when complete for the same rollout file).

    With ``group_success`` (dynamic sampling) the result also carries each group's accuracies ([groups][G], small)
    so the batch source can filter groups without reading the file back."""
    out_name = scored_name(rollout_name)
    source = ctx.store.entry(iteration, rollout_name)
    done = ctx.store.entry(iteration, out_name)
    if done is not None and source is not None and done.meta.get("source_sha256") == source.sha256:
        success = _success_lists(ctx.store.get_table(iteration, out_name), ctx) if group_success else None
        return ScoreResult(out_name, done.rows, True, done.meta["metrics"], success)
    started = time.perf_counter()
    table = ctx.store.get_table(iteration, rollout_name)
    parts, metrics = [], {}
    if table.num_rows:
        results, metrics = score_table(table, ctx.scorer)
        scored, adv_metrics = add_advantages(with_rewards(table, results), ctx.cfg)
        metrics.update(adv_metrics)
        parts.append(scored)
    outside = ctx.store.entry(iteration, INBOX_FILE)
    if outside is not None and rollout_name == "rollouts.parquet":  # inbox groups join the batch, scored already
        taken, adv_metrics = add_advantages(ctx.store.get_table(iteration, INBOX_FILE), ctx.cfg)
        parts.append(taken)
        metrics["inbox_groups"] = float(outside.meta["groups"])
        if not table.num_rows:  # the whole batch is the inbox's (an outside source): its rewards are the metrics
            rewards = [r for r in taken.column("reward").to_pylist() if r is not None]
            metrics.update(adv_metrics, reward_mean=sum(rewards) / len(rewards) if rewards else float("nan"))
            g = ctx.cfg.rollout.samples_per_prompt
            missing = ctx.cfg.rollout.prompts_per_iteration - taken.num_rows // g
            if missing > 0:  # the source went on short: the learner's batch is whole, the rest out of the loss
                parts.append(masked_copies(taken, missing, g))
                metrics["groups_masked"] = float(missing)
    scored = pa.concat_tables(parts, promote_options="default")
    if ctx.teacher is not None:  # on-policy distillation: the teacher grades every sampled token
        scored, teacher_metrics = with_teacher_signal(scored, ctx.teacher, reward_weight=ctx.cfg.distill.reward_weight,
                                                      prompt_key=ctx.cfg.data.prompt_key)
        metrics.update(teacher_metrics)
    metrics["score_seconds"] = time.perf_counter() - started
    entry = ctx.store.put_table(iteration, out_name, scored,
                                meta={"source_sha256": source.sha256 if source else None, "metrics": metrics})
    success = _success_lists(scored, ctx) if group_success else None
    return ScoreResult(out_name, entry.rows, False, metrics, success)


def _success_lists(scored: pa.Table, ctx: RunContext) -> list[list[float]]:
    return group_success(scored, ctx.cfg.rollout.samples_per_prompt).tolist()


@task(name="assemble-batch", task_run_name="assemble-batch-{iteration:06d}", cache_policy=NONE)
def assemble(ctx: RunContext, iteration: int, scored_names: list[str], kept: list[tuple[int, int]],
             filtered_group_frac: float) -> ScoreResult:
    """Dynamic sampling: the training batch from the scored rounds and the (round, group) pairs kept; its metrics
    are the group counts."""
    cfg = ctx.cfg
    tables = [ctx.store.get_table(iteration, n) for n in scored_names]
    batch, metrics = assemble_groups(tables, cfg.rollout.samples_per_prompt, cfg.rollout.prompts_per_iteration, kept)
    metrics["filtered_group_frac"] = filtered_group_frac
    entry = ctx.store.put_table(iteration, "scored.parquet", batch, meta={"sources": scored_names,
                                                                          "metrics": metrics})
    return ScoreResult("scored.parquet", entry.rows, False, metrics)


def assemble_groups(tables: list[pa.Table], group_size: int, target_groups: int,
                    kept: list[tuple[int, int]]) -> tuple[pa.Table, dict[str, float]]:
    """The batch: the ``kept`` (round, group) pairs in their order (at most ``target_groups``; ``DynamicBatch.take``),
    then, while it is short, the other groups in round order with ``kept`` False (no loss): the learner always sees
    the configured batch size."""
    chosen = [tables[r].slice(g * group_size, group_size) for r, g in kept[:target_groups]]
    taken = {tuple(pair) for pair in kept}
    others = [table.slice(g * group_size, group_size) for r, table in enumerate(tables)
              for g in range(table.num_rows // group_size) if (r, g) not in taken]
    filler = [_mask_out(t) for t in others[: target_groups - len(chosen)]]
    return pa.concat_tables(chosen + filler), {"groups_kept": float(len(chosen)), "groups_masked": float(len(filler))}


def masked_copies(groups: pa.Table, count: int, group_size: int) -> pa.Table:
    """``count`` groups copied from ``groups`` in turn, numbered 0.., with ``kept`` False: rows that fill a short
    batch to the learner's size and take no part in the loss."""
    have = groups.num_rows // group_size
    copies = []
    for j in range(count):
        group = _mask_out(groups.slice((j % have) * group_size, group_size))
        idx = group.column_names.index("group_id")
        copies.append(group.set_column(idx, "group_id", pa.array([j] * group_size, group.schema.field(idx).type)))
    return pa.concat_tables(copies)


def _mask_out(group: pa.Table) -> pa.Table:
    idx = group.column_names.index("kept")
    return group.set_column(idx, "kept", pa.array([False] * group.num_rows, pa.bool_()))


def group_outcomes(store: RunStore, group_size: int, iteration: int) -> list[GroupOutcome]:
    """Every group an iteration sampled (each dynamic-sampling round's, when its rounds were scored one by one) with
    its share of right answers (as dynamic sampling judges it, ``group_success``): what the difficulty pool learns
    from. Read from the scored files, so a resume sees what the first attempt saw."""
    names = ["scored.parquet"]
    if store.entry(iteration, "scored-r0.parquet") is not None:
        names = ["scored-r0.parquet"]
        while store.entry(iteration, f"scored-r{len(names)}.parquet") is not None:
            names.append(f"scored-r{len(names)}.parquet")
    out = []
    for name in names:
        table = store.get_table(iteration, name)
        success = group_success(table, group_size)
        if success is None:
            raise ValueError(f"{store.url(f'iter-{iteration:06d}/{name}')} has no reward_accuracy column")
        firsts = slice(None, None, group_size)  # one row per group: its ids
        out += [GroupOutcome(g, p, float(s.mean()))
                for g, p, s in zip(table.column("group_id").to_pylist()[firsts],
                                   table.column("prompt_id").to_pylist()[firsts], success)
                if g is not None and p is not None]
    return out
