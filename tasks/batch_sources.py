"""Where an iteration's training batch comes from: one class per kind, chosen by ``batch_source`` from the config
and nowhere else. The flow asks its source for an iteration's batch (``collect``) and nothing more about where it
came from.

- ``SampledPrompts``: the run's own prompts, sampled by its samplers and scored; options: dynamic sampling (DAPO's
  rounds until enough groups have mixed outcomes, then the batch assembled) and inbox groups (async runs take groups
  outside producers left in the run folder's inbox in place of some of their own prompts).
- ``OutsideGroups``: every group comes from outside (an Atropos API server's ``/batch`` or the policy endpoint's
  clients, ``tasks/outside.py``): the source fills the inbox, the iteration takes it; nothing is sampled here.
- ``Conversations``: SFT; the iteration's conversations are its batch, nothing sampled or scored.

Adding a source: a class with ``collect`` (and ``open``/``close`` if it holds processes), and its case in
``batch_source``. Every source writes its iteration's ``scored.parquet`` (the learner's input) through the stage
tasks, so resume and the run folder's layout are the same for all.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from grpo_core.config import GRPOConfig
from grpo_core.outside.source import OutsideSource
from tasks.context import RunContext
from tasks.inbox import INBOX_FILE
from tasks.outside import close_outside, open_atropos, open_clients
from tasks.results import FillResult, InboxResult, RolloutResult, ScoreResult
from tasks.stages import Stages


@dataclass
class Batch:
    """One iteration's training batch as collected: the rollout results (one per dynamic-sampling round), the score
    result, the seconds spent inside the engines and scorer, the wall seconds, stage timestamps, what the iteration
    took from the inbox and what an outside source put there first, and the file whose sequences the weight check
    reads."""
    rollouts: list[RolloutResult]
    scored: ScoreResult
    inside: float
    wall: float
    stamps: dict[str, float]
    check_file: str
    inbox: InboxResult
    filled: FillResult | None = None


class BatchSource:
    """Where an iteration's batch comes from. ``open`` once the engines (and the endpoint) serve, at the first
    iteration this flow run trains; ``close`` when the run ends, whatever the way."""

    def __init__(self, stages: Stages):
        self.stages = stages

    def open(self, ctx: RunContext, first_iteration: int) -> None:
        """Start what the source needs beyond the engines (nothing by default)."""

    def collect(self, ctx: RunContext, iteration: int) -> Batch:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what ``open`` started."""


class SampledPrompts(BatchSource):
    """The run's own prompts, sampled and scored. With ``dynamic`` (algo.filter_groups), rounds are added until
    enough groups have mixed outcomes or ``max_resample_times`` more rounds were sampled, then the batch is assembled;
    with ``takes_inbox`` (async RL), groups from the inbox replace the iteration's last prompts."""

    def __init__(self, stages: Stages, dynamic: bool, takes_inbox: bool):
        super().__init__(stages)
        self.dynamic, self.takes_inbox = dynamic, takes_inbox

    def collect(self, ctx: RunContext, iteration: int) -> Batch:
        import torch

        from grpo_core.algo import DynamicBatch

        cfg, stages = ctx.cfg, self.stages
        t0, stamps = time.perf_counter(), {"rollout_started_at": ctx.clock()}
        taken = stages.take_inbox(ctx, iteration, own_groups=1) if self.takes_inbox else InboxResult()
        a = cfg.algo
        rounds = DynamicBatch(cfg.rollout.prompts_per_iteration, a.max_resample_times, a.filter_range) \
            if self.dynamic else None
        rollouts, scored = [], []
        while not rollouts or (rounds is not None and not (rounds.full or rounds.exhausted)):
            name = f"rollouts-r{len(rollouts)}.parquet" if self.dynamic else "rollouts.parquet"
            rollouts.append(stages.rollout(ctx, iteration, len(rollouts), name=name))
            scored.append(_scored(ctx, stages, iteration, rollouts[-1], stamps, group_success=self.dynamic))
            if rounds is not None:  # which groups are kept is decided here, once: assemble takes them
                success = torch.tensor(scored[-1].group_success, dtype=torch.float64)
                rounds.add(success, [(len(scored) - 1, g) for g in range(success.shape[0])])
        if rounds is None:
            sc = scored[0]
        else:  # the assembled batch: the first round's reward metrics, the group counts, every round's seconds
            out = stages.assemble(ctx, iteration, [s.name for s in scored], rounds.take(), rounds.filtered_frac)
            sc = ScoreResult(out.name, out.rows, False, {**scored[0].metrics, **out.metrics,
                                                         "score_seconds": sum(s.seconds for s in scored)})
        return _batch(rollouts, sc, t0, stamps, rollouts[0].name, taken)


class OutsideGroups(BatchSource):
    """Every group from outside (``atropos``, or ``endpoint.clients``; ``opener`` starts the one the run has):
    before an iteration takes its inbox, the outside source fills it with the groups the iteration still needs; the
    iteration samples nothing of its own (a short batch is padded with masked copies when scored)."""

    def __init__(self, stages: Stages, opener: Callable[[RunContext, int], OutsideSource]):
        super().__init__(stages)
        self.opener = opener
        self.outside: OutsideSource | None = None

    def open(self, ctx: RunContext, first_iteration: int) -> None:
        self.outside = self.opener(ctx, first_iteration)

    def collect(self, ctx: RunContext, iteration: int) -> Batch:
        stages = self.stages
        t0, stamps = time.perf_counter(), {"rollout_started_at": ctx.clock()}
        filled = stages.fill_inbox(ctx, iteration, self.outside)
        taken = stages.take_inbox(ctx, iteration, own_groups=0)
        rollout = stages.rollout(ctx, iteration, 0, name="rollouts.parquet", sample=False)
        scored = _scored(ctx, stages, iteration, rollout, stamps)
        return _batch([rollout], scored, t0, stamps, INBOX_FILE, taken, filled)

    def close(self) -> None:
        if self.outside is not None:
            close_outside(self.outside)
            self.outside = None


class Conversations(BatchSource):
    """SFT: the iteration's conversations are its batch; nothing is sampled or scored."""

    def collect(self, ctx: RunContext, iteration: int) -> Batch:
        t0, stamps = time.perf_counter(), {"rollout_started_at": ctx.clock()}
        rollout, scored = self.stages.conversations(ctx, iteration)
        stamps["rollout_ended_at"] = stamps["score_started_at"] = stamps["score_ended_at"] = ctx.clock()
        return Batch([rollout], scored, 0.0, time.perf_counter() - t0, stamps, rollout.name, InboxResult())


def _scored(ctx: RunContext, stages: Stages, iteration: int, rollout: RolloutResult, stamps: dict[str, float],
            group_success: bool = False) -> ScoreResult:
    """One rollout file scored, with the stage timestamps (the score stage starts when the first rollout ends)."""
    stamps["rollout_ended_at"] = ctx.clock()
    stamps.setdefault("score_started_at", stamps["rollout_ended_at"])
    scored = stages.score(ctx, iteration, rollout.name, group_success=group_success)
    stamps["score_ended_at"] = ctx.clock()
    return scored


def _batch(rollouts: list[RolloutResult], scored: ScoreResult, t0: float, stamps: dict[str, float], check_file: str,
           taken: InboxResult, filled: FillResult | None = None) -> Batch:
    inside = sum(r.seconds for r in rollouts if not r.reused) + scored.seconds
    return Batch(rollouts, scored, inside, time.perf_counter() - t0, stamps, check_file, taken, filled)


def batch_source(cfg: GRPOConfig, stages: Stages) -> BatchSource:
    """The run's batch source: the one place that reads which sections say where batches come from."""
    if not cfg.kind.samples:
        return Conversations(stages)
    if cfg.atropos is not None:
        return OutsideGroups(stages, open_atropos)
    if cfg.endpoint is not None and cfg.endpoint.clients:
        return OutsideGroups(stages, open_clients)
    dynamic = cfg.algo.filter_groups
    return SampledPrompts(stages, dynamic=dynamic, takes_inbox=cfg.window.takes_inbox(dynamic))
