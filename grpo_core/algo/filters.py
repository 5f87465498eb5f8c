"""DAPO's sample-level filters and shaping: dynamic sampling, overlong filtering, soft overlong punishment.

Dynamic sampling: a group whose answers are all right (or all wrong) has zero advantage everywhere and only dilutes
the batch. DAPO drops such groups (its rule: the group's accuracy std is non-zero) and samples more prompts until the
batch holds the target number of groups. Here the rule is written with the group's SUCCESS RATE p = mean of the
per-sample success in [0, 1] (pass the accuracy reward, not a shaped reward): a group is kept iff
`low < p < high`, both bounds EXCLUSIVE. With the default (0, 1) this drops exactly the all-wrong (p = 0) and
all-right (p = 1) groups, which for binary accuracy is DAPO's std != 0 rule.

Overlong: a truncated answer was cut, not wrong; DAPO either masks it out of the loss (`overlong_mask`) or shapes
its reward with a linear penalty over the last `cache_length` tokens of the budget (`soft_overlong_penalty`).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

# DAPO paper: 20480-token budget with a 4096-token cache, i.e. a fifth of the budget.
SOFT_OVERLONG_CACHE_FRACTION = 0.2


def _check_range(filter_range: tuple[float, float]) -> tuple[float, float]:
    if len(filter_range) != 2:
        raise ValueError(f"filter_range must be (low, high), got {filter_range!r}")
    lo, hi = float(filter_range[0]), float(filter_range[1])
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"filter_range must satisfy 0 <= low < high <= 1 (bounds are exclusive), got {filter_range}")
    return lo, hi


def group_filter(rewards: Tensor, filter_range: tuple[float, float] = (0.0, 1.0)) -> tuple[Tensor, dict[str, float]]:
    """Which groups dynamic sampling keeps.

    rewards: [N, G] per-sample success in [0, 1] (accuracy; 1 = right). filter_range: (low, high), exclusive.
    Returns (keep [N] bool: low < mean_g(rewards) < high, metrics: kept/dropped counts, all-right and all-wrong
    fractions).
    """
    lo, hi = _check_range(filter_range)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards contains NaN or inf: group_filter needs a success value for every sample")
    if bool((r < 0).any()) or bool((r > 1).any()):
        raise ValueError(f"rewards must be success values in [0, 1] (pass the accuracy, not a shaped reward); got "
                         f"min {float(r.min())}, max {float(r.max())}")
    p = r.mean(dim=1)
    keep = (p > lo) & (p < hi)
    n = max(int(rewards.shape[0]), 1)
    metrics = {
        "groups_kept": float(keep.sum()),
        "groups_dropped": float((~keep).sum()),
        "group_all_right_frac": float((p >= 1.0).sum()) / n,
        "group_all_wrong_frac": float((p <= 0.0).sum()) / n,
    }
    return keep, metrics


class DynamicBatch:
    """Collects kept groups across sampling rounds until `target_groups` are kept or the rounds run out.

    The batch source's loop (tasks/batch_sources.py): while not (batch.full or batch.exhausted): sample n prompts;
    batch.add(acc [n, G], ids); then `batch.take()` is the kept groups the batch is assembled from (the one place
    that decides them). Round 1 is the normal sample; `max_resample_times` more rounds are allowed, so at most
    1 + max_resample_times rounds. Pure bookkeeping: no tensors are kept beyond what `add` filters.
    """

    def __init__(self, target_groups: int, max_resample_times: int,
                 filter_range: tuple[float, float] = (0.0, 1.0)) -> None:
        if target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {target_groups}")
        if max_resample_times < 0:
            raise ValueError(f"max_resample_times must be >= 0, got {max_resample_times}")
        self.target_groups = target_groups
        self.max_resample_times = max_resample_times
        self.filter_range = _check_range(filter_range)
        self.rounds = 0
        self.groups_seen = 0
        self._kept: list[Any] = []

    @property
    def full(self) -> bool:
        return len(self._kept) >= self.target_groups

    @property
    def exhausted(self) -> bool:
        """True once 1 + max_resample_times rounds were added."""
        return self.rounds >= 1 + self.max_resample_times

    @property
    def filtered_frac(self) -> float:
        """Share of the groups seen so far that the filter dropped."""
        return 1.0 - len(self._kept) / max(1, self.groups_seen)

    def add(self, group_rewards: Tensor, payload_indices: Sequence[Any]) -> dict[str, float]:
        """Filter one round: group_rewards [n, G] (success in [0, 1]); payload_indices: n items identifying the
        groups (row indices, group ids). Returns the round's metrics."""
        if self.full or self.exhausted:
            raise RuntimeError(f"DynamicBatch.add called after the batch is done (full={self.full}, "
                               f"exhausted={self.exhausted}, rounds={self.rounds})")
        if group_rewards.dim() != 2 or len(payload_indices) != group_rewards.shape[0]:
            raise ValueError(f"payload_indices has {len(payload_indices)} items but group_rewards has shape "
                             f"{tuple(group_rewards.shape)}: give one index per group (row)")
        keep, metrics = group_filter(group_rewards, self.filter_range)
        self._kept.extend(idx for idx, k in zip(payload_indices, keep.tolist()) if k)
        self.rounds += 1
        self.groups_seen += int(group_rewards.shape[0])
        metrics.update({"dynamic_rounds": float(self.rounds), "dynamic_groups_kept_total": float(len(self._kept)),
                        "dynamic_fill": min(len(self._kept) / self.target_groups, 1.0)})
        return metrics

    def take(self) -> list[Any]:
        """The kept payload indices in arrival order: exactly target_groups when full, all kept otherwise."""
        return list(self._kept[: self.target_groups])


def overlong_mask(truncated: Tensor) -> tuple[Tensor, dict[str, float]]:
    """DAPO overlong filtering. truncated: [B] bool (finish_reason == "length"). Returns (keep [B] = ~truncated,
    {"truncated_frac"}); multiply `keep[:, None]` into the loss mask."""
    if truncated.dim() != 1:
        raise ValueError(f"truncated must be [B], got shape {tuple(truncated.shape)}")
    t = truncated.to(torch.bool)
    return ~t, {"truncated_frac": float(t.float().mean()) if t.numel() else 0.0}


def default_cache_length(max_new_tokens: int) -> int:
    """The soft-overlong cache sized to the run: a fifth of the budget (DAPO: 4096 of 20480), at least 1."""
    if max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be >= 2 for soft overlong punishment, got {max_new_tokens}")
    return max(1, int(max_new_tokens * SOFT_OVERLONG_CACHE_FRACTION))


def soft_overlong_penalty(lengths: Tensor, max_new_tokens: int, cache_length: int | None = None,
                          penalty: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """DAPO's soft overlong punishment, added to the reward. lengths: [B] response lengths in tokens.

    With L_max = max_new_tokens and L_cache = cache_length (None or 0: `default_cache_length(max_new_tokens)`,
    matching `algo.soft_overlong_cache_length: 0`):
      0                                        if L <= L_max - L_cache
      (L_max - L_cache - L) / L_cache * penalty if L_max - L_cache < L <= L_max
      -penalty                                 if L > L_max
    Returns (penalty [B] float32 (<= 0), metrics).
    """
    if cache_length is None or cache_length == 0:
        cache_length = default_cache_length(max_new_tokens)
    if not 1 <= cache_length < max_new_tokens:
        raise ValueError(f"cache_length must satisfy 1 <= cache_length < max_new_tokens={max_new_tokens}, "
                         f"got {cache_length}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be [B], got shape {tuple(lengths.shape)}")
    length = lengths.to(torch.float64)
    start = float(max_new_tokens - cache_length)
    ramp = (start - length) / cache_length * penalty
    out = torch.where(length <= start, torch.zeros_like(length), ramp)
    out = torch.where(length > max_new_tokens, torch.full_like(length, -penalty), out)
    out = out.to(torch.float32)
    n = max(lengths.numel(), 1)
    return out, {"overlong_penalty_mean": float(out.mean()) if lengths.numel() else 0.0,
                 "overlong_penalized_frac": float((length > start).sum()) / n}
