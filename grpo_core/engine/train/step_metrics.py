"""How each metric of a policy update is reduced: over one rank's micro-batches, then over the learner ranks.

Why one table: a loss sums over the micro-batches of an optimizer step and over the ranks (each holds a part of the
mini-batch's loss); a largest difference is a max wherever it is merged; a clip fraction is a mean; the learning rate
is the same everywhere. These rules used to be spelled by key name in the learner's loop and again in the driver's
merge; here each metric's rule is declared once, and a metric not named is a mean over both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MicroReduce = Literal["mean", "max", "step_sum"]
RankReduce = Literal["mean", "sum", "max", "same"]


@dataclass(frozen=True)
class Reduction:
    """``micro``: over one rank's micro-batches (``step_sum``: summed within each optimizer step, then averaged
    over the steps); ``ranks``: over the learner ranks' results (``same``: equal by construction, rank 0's)."""
    micro: MicroReduce = "mean"
    ranks: RankReduce = "mean"


MEAN = Reduction()
REDUCTIONS: dict[str, Reduction] = {
    "loss": Reduction(micro="step_sum", ranks="sum"),
    "pg_loss": Reduction(ranks="sum"),
    "tokens": Reduction(ranks="sum"),
    "seconds": Reduction(ranks="max"),
    "mismatch_abs_logp_max": Reduction(micro="max", ranks="max"),
    "grad_norm": Reduction(ranks="same"),
    "lr": Reduction(ranks="same"),
    "optimizer_steps": Reduction(ranks="same"),
    # PPO's critic (grpo_core.engine.train.critic): its loss as the policy's; the GAE figures are computed on the
    # whole batch by every rank
    "value_loss": Reduction(micro="step_sum", ranks="sum"),
    "critic_grad_norm": Reduction(ranks="same"),
    "critic_lr": Reduction(ranks="same"),
    "critic_seconds": Reduction(ranks="max"),
    "returns_mean": Reduction(ranks="same"),
    "values_mean": Reduction(ranks="same"),
    "value_explained_var": Reduction(ranks="same"),
}


def reduction(name: str) -> Reduction:
    return REDUCTIONS.get(name, MEAN)


class MicroBatchMetrics:
    """One rank's metrics of one update, gathered micro-batch by micro-batch and reduced by ``REDUCTIONS``."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._maxes: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if reduction(k).micro == "max":
                self._maxes[k] = max(self._maxes.get(k, 0.0), float(v))
            else:
                self._sums[k] = self._sums.get(k, 0.0) + float(v)
                self._counts[k] = self._counts.get(k, 0) + 1

    def result(self, steps: int) -> dict[str, float]:
        """The reduced metrics of an update of ``steps`` optimizer steps."""
        out = {}
        for k, total in self._sums.items():
            out[k] = total / max(1, steps) if reduction(k).micro == "step_sum" else total / self._counts[k]
        out.update(self._maxes)
        return out


def merge_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One update's metrics from every learner rank's (``REDUCTIONS``' rank rules)."""
    out = dict(per_rank[0])
    for key in per_rank[0]:
        values = [m[key] for m in per_rank if isinstance(m.get(key), (int, float))]
        if len(values) != len(per_rank):
            continue
        how = reduction(key).ranks
        if how == "sum":
            out[key] = float(sum(values))
        elif how == "max":
            out[key] = max(values)
        elif how == "mean":
            out[key] = sum(values) / len(values)
    return out
