"""The score stage: rewards for every rollout row, then advantages and the mask of rows that count in the loss.

A row that could not be scored keeps its place with a null reward and the reason (``reward_error``); it is left out
of the loss and does not move its group's baseline. Rows are never dropped: filters only clear ``kept``.
"""
from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import torch

from grpo_core.algo import compute_advantages, group_filter, overlong_mask, soft_overlong_penalty
from grpo_core.pipeline.turn_credit import with_turn_credit
from grpo_core.config import GRPOConfig
from grpo_core.data.schemas import RESPONSE_MASK, ROLLOUT_SCHEMA
from grpo_core.rewards.scorer import RewardResult, Scorer


def dataset_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The dataset columns of each rollout row (what reward functions receive besides the completion); for
    multi-turn episodes also the episode's columns (``env_reward``, ``episode_turns``, ...) but not its token mask."""
    names = [n for n in table.column_names if n not in ROLLOUT_SCHEMA.names and n != RESPONSE_MASK]
    return table.select(names).to_pylist()


def score_table(table: pa.Table, scorer: Scorer) -> tuple[list[RewardResult], dict[str, float]]:
    completions = table.column("response_text").to_pylist()
    lengths = table.column("response_length").to_pylist()
    rows = dataset_rows(table)
    results = scorer.score(completions, rows, completion_lengths=lengths)
    scored = [r.reward for r in results if r.reward is not None]
    # The share of distinct (response, prompt) pairs: what the verifiers ran on (reward.dedupe verifies repeats once;
    # a prompt's rows carry the same dataset columns, so the prompt id stands for them here).
    distinct = len(set(zip(completions, table.column("prompt_id").to_pylist())))
    # A mean over no values is left out, not NaN (metrics go into JSON manifests): a component that applied to no row
    # of the batch (a plugin's None everywhere) has no mean this iteration.
    metrics = {"unscored": float(len(results) - len(scored)),
               "distinct_frac": distinct / len(completions) if completions else float("nan")}
    if scored:
        metrics["reward_mean"] = sum(scored) / len(scored)
    for name in (results[0].components if results else {}):
        values = [r.components.get(name) for r in results if r.components.get(name) is not None]
        if values:
            metrics[f"reward_{name}_mean"] = sum(values) / len(values)
    return results, metrics


def with_rewards(table: pa.Table, results: list[RewardResult]) -> pa.Table:
    out = table.append_column("reward", pa.array([r.reward for r in results], pa.float64()))
    for name in (results[0].components if results else {}):
        out = out.append_column(f"reward_{name}", pa.array([r.components.get(name) for r in results], pa.float64()))
    for name in dict.fromkeys(name for r in results for name in r.raw):  # judges' verdict texts
        out = out.append_column(f"reward_{name}_raw", pa.array([r.raw.get(name) for r in results], pa.string()))
    return out.append_column("reward_error", pa.array([r.error for r in results], pa.string()))


def group_rewards(table: pa.Table, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, G] rewards (unscored rows filled with their group's mean, so they leave the baseline alone) and the
    [N, G] mask of scored rows. Rows must be ordered by group then sample, as the rollout stage writes them.
    A group holding a reward that is NaN or infinite is left out whole (every row unscored): its statistics
    cannot be computed, and that stops the group, not the run (``nonfinite_groups`` counts them)."""
    rewards = table.column("reward").to_pylist()
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rows do not form groups of {group_size}")
    finite = _finite_groups(rewards, group_size)
    scored = torch.tensor([r is not None for r in rewards]).view(-1, group_size) & finite.unsqueeze(1)
    values = torch.tensor([0.0 if r is None or not math.isfinite(r) else float(r) for r in rewards],
                          dtype=torch.float64).view(-1, group_size)
    counts = scored.sum(dim=1, keepdim=True).clamp(min=1)
    fill = (values * scored).sum(dim=1, keepdim=True) / counts
    return torch.where(scored, values, fill), scored


def _finite_groups(rewards: list[float | None], group_size: int) -> torch.Tensor:
    """[N] bool: the groups none of whose rewards is NaN or infinite (a null reward is unscored, not a fault)."""
    return torch.tensor([r is None or math.isfinite(r) for r in rewards]).view(-1, group_size).all(dim=1)


def nonfinite_groups(table: pa.Table, group_size: int) -> int:
    """How many groups hold a reward that is NaN or infinite (left out of the step whole by ``group_rewards``)."""
    return int((~_finite_groups(table.column("reward").to_pylist(), group_size)).sum())


def group_success(table: pa.Table, group_size: int) -> torch.Tensor | None:
    """[N, G] accuracy in [0, 1] (unscored rows count as wrong): what dynamic sampling filters on."""
    if "reward_accuracy" not in table.column_names:
        return None
    acc = [0.0 if a is None else float(a) for a in table.column("reward_accuracy").to_pylist()]
    return torch.tensor(acc, dtype=torch.float64).view(-1, group_size)


def _advantages(rewards: torch.Tensor, algo) -> tuple[torch.Tensor, dict[str, float]]:
    """[N, G] each answer's advantage from its group's rewards. With a critic (``algo.uses_critic``: PPO's GAE) the
    advantages are per token and the learner computes them from the critic's values and these (shaped) rewards, so
    the column holds 0, except where a reward does not fit the learner's float32: inf, so that its group is left
    out as an overflowing group's statistics are."""
    if not algo.uses_critic:
        return compute_advantages(rewards, algo.advantage_estimator, algo.advantage_scale)
    unfit = ~torch.isfinite(rewards.float())
    spread = float(rewards.std()) if rewards.numel() > 1 else 0.0
    return torch.where(unfit, torch.full_like(rewards, math.inf), torch.zeros_like(rewards)), \
        {"reward_mean": float(rewards.mean()), "reward_std": spread}


def add_advantages(table: pa.Table, cfg: GRPOConfig) -> tuple[pa.Table, dict[str, float]]:
    """Soft overlong shaping, advantages, and the kept mask (unscored rows, overlong filter)."""
    algo, g = cfg.algo, cfg.rollout.samples_per_prompt
    rewards, scored = group_rewards(table, g)
    metrics: dict[str, float] = {"nonfinite_groups": float(nonfinite_groups(table, g))}
    if algo.soft_overlong:
        lengths = torch.tensor(table.column("response_length").to_pylist(), dtype=torch.float64)
        penalty, m = soft_overlong_penalty(lengths, cfg.rollout.max_new_tokens, algo.soft_overlong_cache_length,
                                           algo.soft_overlong_penalty)
        rewards = rewards + penalty.view(-1, g)
        metrics.update(m)
    advantages, m = _advantages(rewards, algo)
    # Finite rewards whose statistics overflow (1e308 in a plugin's reward: the group's sum is inf) or whose
    # advantages do not fit the float32 the learner trains on: that group is left out whole, like a NaN reward, and
    # the advantages and their metrics computed again without it.
    overflow = ~torch.isfinite(advantages.float()).all(dim=1)
    if bool(overflow.any()):
        rewards = torch.where(overflow.unsqueeze(1), torch.zeros_like(rewards), rewards)
        scored = scored & ~overflow.unsqueeze(1)
        metrics["nonfinite_groups"] += float(overflow.sum())
        advantages, m = _advantages(rewards, algo)
    metrics.update(m)
    kept = scored.reshape(-1).clone()
    if algo.overlong_filter:
        keep, m = overlong_mask(torch.tensor(table.column("truncated").to_pylist()))
        kept &= keep
        metrics.update(m)
    success = group_success(table, g)
    if success is not None:
        _, m = group_filter(success, algo.filter_range)
        metrics.update(m)
    out = table.append_column("shaped_reward", pa.array(rewards.reshape(-1).tolist(), pa.float64()))
    out = out.append_column("advantage", pa.array(advantages.reshape(-1).float().tolist(), pa.float32()))
    out = out.append_column("kept", pa.array(kept.tolist(), pa.bool_()))
    metrics["kept_frac"] = float(kept.float().mean())
    if algo.turn_credit == "step_groups":  # multi-turn: each turn's own advantage, per token
        out, m = with_turn_credit(out, g, algo.turn_credit_weight, algo.turn_discount)
        metrics.update(m)
    return out, metrics
