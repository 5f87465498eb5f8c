"""What the stage tasks return, typed, and the metrics row built from it in one place.

Why: the flow used to read untyped dicts with ``.get``, so a misspelt key became a silent None column in
metrics.parquet. Here each task returns a dataclass (a misspelt attribute fails at once), the open-ended metric sets
(per-reward means, the algorithm's clip fractions) stay dicts inside them, and ``IterationRecord.row`` is the only
place that names the columns of an iteration's row.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from grpo_core.engine.precision import LogprobGap
from grpo_core.engine.results import SyncResult, TrainStep

__all__ = ["EvalResult", "InboxResult", "IterationRecord", "IterationTimes", "RolloutResult", "ScoreResult",
           "SyncResult", "TrainResult", "sync_gap_columns"]


@dataclass(frozen=True)
class RolloutResult:
    """One rollout round: the file written under ``iter-N/`` and what the samplers did."""
    name: str
    rows: int
    reused: bool  # found complete in the run folder (a resume), not sampled again
    seconds: float
    policy_version: int
    tokens: int
    response_length_mean: float
    response_length_max: int
    truncated_frac: float
    samplers_used: int = 0
    samplers_lost: int = 0
    samplers_live: int = 0
    # multi-turn episodes only (None otherwise): per episode means, and shares of episodes
    turns_mean: float | None = None
    tool_calls_mean: float | None = None
    tool_call_frac: float | None = None       # episodes with at least one tool call
    tool_errors: int | None = None             # calls that failed, timed out or printed too much
    episode_truncated_frac: float | None = None  # cut by max_turns or a token budget before the policy answered
    env_errors: int | None = None              # episodes ended by an environment that raised or hung
    # data.sampler=difficulty_pool only: the pool when the iteration's prompts were drawn
    pool_active: int | None = None             # train prompts in the pool
    pool_easy: int | None = None               # out of it: their last group was all right
    pool_hard: int | None = None               # out of it: all wrong
    pool_skipped: int | None = None            # turns passed over to draw this iteration's prompts

    @classmethod
    def from_meta(cls, name: str, rows: int, reused: bool, meta: dict[str, Any]) -> "RolloutResult":
        """From the metadata the rollout file's manifest entry holds (``meta()``)."""
        known = {f.name for f in fields(cls)} - {"name", "rows", "reused"}
        return cls(name=name, rows=rows, reused=reused, **{k: v for k, v in meta.items() if k in known})

    def meta(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("name", "rows", "reused")}


@dataclass(frozen=True)
class FillResult:
    """What an outside source put into the inbox for an iteration (``fill_inbox``) before it was taken."""
    reused: bool = False  # the iteration had taken its groups already (a resume): nothing filled
    groups: int = 0
    refused: int = 0      # groups refused (kept in inbox/rejected with the reason)
    wait_s: float = 0.0   # seconds the iteration waited for its groups
    process_restarts: int = 0
    server_restarts: int = 0
    short: int = 0        # groups the iteration went without (nothing came for the wait; masked out of the batch)

    def columns(self) -> dict[str, Any]:
        return {"outside_groups": self.groups, "outside_refused": self.refused, "outside_wait_s": self.wait_s,
                "outside_process_restarts": self.process_restarts, "outside_server_restarts": self.server_restarts,
                "outside_short_groups": self.short}


@dataclass(frozen=True)
class InboxResult:
    """What an iteration took from the inbox (``take_inbox``): nothing, unless groups > 0."""
    reused: bool = False  # the iteration's inbox.parquet was there already (a resume)
    groups: int = 0
    rows: int = 0
    items: tuple[str, ...] = ()  # the inbox files taken
    rejected: int = 0            # files refused this time (kept in inbox/rejected)
    version_min: int | None = None
    version_sum: int = 0         # of the rows' policy versions (for the staleness metrics)

    @classmethod
    def from_meta(cls, reused: bool, meta: dict[str, Any]) -> "InboxResult":
        """From the metadata of inbox.parquet's manifest entry (``meta()``)."""
        return cls(reused=reused, groups=meta["groups"], rows=meta["rows"], items=tuple(meta["items"]),
                   rejected=meta.get("rejected", 0), version_min=meta.get("version_min"),
                   version_sum=meta.get("version_sum", 0))

    def meta(self) -> dict[str, Any]:
        return {"groups": self.groups, "rows": self.rows, "items": list(self.items), "rejected": self.rejected,
                "version_min": self.version_min, "version_sum": self.version_sum}


@dataclass(frozen=True)
class EvalResult:
    """One evaluation (``evaluate``): the first eval set's figures (the run's ``eval_accuracy``), every set's
    ``eval/<name>/...`` metrics, and the first set's best and worst completions for the Prefect artifact."""
    accuracy: float
    set: str
    greedy: bool
    rows: int
    reward_mean: float | None  # None when no response could be scored
    policy_version: int | None
    seconds: float
    metrics: dict[str, float]
    best: list[dict[str, Any]] = field(default_factory=list)
    worst: list[dict[str, Any]] = field(default_factory=list)


EPISODE_METRICS = ("turns_mean", "tool_calls_mean", "tool_call_frac", "tool_errors", "episode_truncated_frac",
                   "env_errors")
POOL_METRICS = ("pool_active", "pool_easy", "pool_hard", "pool_skipped")


@dataclass(frozen=True)
class ScoreResult:
    """A scored file (one round's, or the assembled batch) and its metrics: ``reward_mean``, one mean per reward
    component, advantage statistics, dynamic sampling's group counts."""
    name: str
    rows: int
    reused: bool
    metrics: dict[str, float]
    group_success: list[list[float]] | None = None  # dynamic sampling: [groups][G] accuracies

    @property
    def reward_mean(self) -> float:
        return self.metrics["reward_mean"]

    @property
    def seconds(self) -> float:
        return float(self.metrics.get("score_seconds", 0.0))

    def component_means(self) -> dict[str, float]:
        """``reward_<name>_mean`` of every reward component that applied to some row (model rewards included)."""
        return {k: v for k, v in self.metrics.items() if k.startswith("reward_") and k.endswith("_mean")}

    def metric(self, name: str) -> float | None:
        """A metric that only some configurations produce (None otherwise)."""
        return self.metrics.get(name)


# Learner metrics that only some algorithms produce; the row has a column for each (None where absent).
ALGORITHM_METRICS = ("nll", "clipfrac", "clipfrac_low", "clipfrac_high", "approx_kl", "kl_ref", "entropy",
                     "mismatch_abs_logp_mean", "mismatch_abs_logp_max", "offpolicy_weight_mean",
                     "offpolicy_masked_frac", "offpolicy_capped_frac", "top_k_kl")

# PPO's critic's metrics (the train stage's, a critic set): columns only in such a run's rows.
CRITIC_METRICS = ("value_loss", "value_clipfrac", "value_explained_var", "values_mean", "returns_mean", "vpred_mean",
                  "critic_grad_norm", "critic_lr", "critic_seconds")

# Turn-level credit's metrics (the score stage's, algo.turn_credit: step_groups): columns only in such a run's rows.
TURN_CREDIT_METRICS = ("step_group_size_mean", "step_grouped_frac", "step_adv_abs_mean")

# On-policy distillation's metrics (the score stage's, distill set): columns only in a distillation run's rows.
DISTILL_METRICS = ("reverse_kl", "teacher_logprob_mean", "teacher_agreement", "teacher_top_k_mass")


@dataclass(frozen=True)
class TrainResult:
    """One policy update, merged over the learner ranks (``TrainStep``), and when it ran (``RunContext.clock``:
    in async RL it runs beside the next rollout)."""
    step: TrainStep
    started_at: float
    ended_at: float

    @property
    def metrics(self) -> dict[str, float]:
        return self.step.metrics

    @property
    def seconds(self) -> float:
        return self.step.seconds

    @property
    def policy_version(self) -> int:
        return self.step.policy_version


@dataclass(frozen=True)
class IterationTimes:
    """Wall seconds of one iteration's stages as the flow measured them, and the stage timestamps
    (``<stage>_started_at`` / ``_ended_at``, seconds since the flow run started)."""
    eval_s: float | None
    rollout_s: float
    train_s: float
    sync_s: float
    total_s: float
    overhead_s: float
    stamps: dict[str, float]  # rollout and score stage timestamps
    sync_started_at: float
    sync_ended_at: float


def sync_gap_columns(gap: LogprobGap | None) -> dict[str, float | None]:
    """The logprob gap's metric columns (None when the sync was not checked)."""
    return {"sync_logprob_max_diff": gap.max_diff if gap else None,
            "sync_logprob_p99_diff": gap.p99_diff if gap else None,
            "sync_logprob_mean_diff": gap.mean_diff if gap else None,
            "sync_logprob_k3": gap.k3 if gap else None,
            **({f"sync_logprob_max_diff_sampler{i}": d for i, d in gap.per_sampler.items()} if gap else {})}


@dataclass(frozen=True)
class IterationRecord:
    """One iteration as its stages left it: ``row()`` is its metrics.parquet row, the one place that names the
    columns of an iteration's row."""
    iteration: int
    attempt: int
    samplers: int          # live samplers when the iteration started
    resynced: bool         # a sampler served other weights than the learner's and was synced again first
    evaluation: EvalResult | None
    rollouts: list[RolloutResult]
    scored: ScoreResult
    inbox: InboxResult
    staleness: tuple[float, float]
    train: TrainResult
    sync: SyncResult
    times: IterationTimes
    filled: FillResult | None = None         # what an outside source put into the inbox first
    checkpoint_s: float | None = None        # taking a checkpoint (iterations with one)
    checkpoint_snapshot_s: float | None = None

    def row(self) -> dict[str, Any]:
        """The metrics.parquet row."""
        evaluation, scored, train, sync, times = self.evaluation, self.scored, self.train, self.sync, self.times
        rollouts, first = self.rollouts, self.rollouts[0]
        row: dict[str, Any] = {
            "iteration": self.iteration, "run_attempt": self.attempt, "samplers": self.samplers,
            "resynced": self.resynced,
            "eval_accuracy": evaluation.accuracy if evaluation else None,
            **(evaluation.metrics if evaluation else {}),
            **({"time_eval_s": times.eval_s} if times.eval_s is not None else {}),
            "policy_version": first.policy_version,
            "staleness_mean": self.staleness[0], "staleness_max": self.staleness[1],
            "inbox_groups": self.inbox.groups, "inbox_rejected": self.inbox.rejected,
            **(self.filled.columns() if self.filled is not None else {}),
            "reward_mean": scored.reward_mean, "accuracy_mean": scored.metric("reward_accuracy_mean"),
            **scored.component_means(),
            "distinct_frac": scored.metric("distinct_frac"),
            **{name: scored.metrics[name] for name in (*DISTILL_METRICS, *TURN_CREDIT_METRICS)
               if name in scored.metrics},
            "loss": train.metrics["loss"], "grad_norm": train.metrics["grad_norm"], "lr": train.metrics["lr"],
            "padded_frac": train.metrics.get("padded_frac"),
            "computed_tokens_frac": train.metrics.get("computed_tokens_frac"),
            **{name: train.metrics.get(name) for name in ALGORITHM_METRICS},
            **({name: train.metrics.get(name) for name in CRITIC_METRICS} if "value_loss" in train.metrics else {}),
            "response_length_mean": first.response_length_mean, "truncated_frac": first.truncated_frac,
            **({name: getattr(first, name) for name in EPISODE_METRICS} if first.turns_mean is not None else {}),
            **({name: getattr(first, name) for name in POOL_METRICS} if first.pool_active is not None else {}),
            "rollout_tokens": sum(r.tokens for r in rollouts),
            "kept_frac": scored.metric("kept_frac"), "rollout_rounds": len(rollouts),
            "samplers_lost": sum(r.samplers_lost for r in rollouts),
            "samplers_replaced": sync.samplers_replaced, "samplers_out": sync.samplers_out,
            "filtered_group_frac": scored.metric("filtered_group_frac"),
            "nonfinite_groups": scored.metric("nonfinite_groups"),
            "rows_nonfinite": train.metrics.get("rows_nonfinite"),
            "time_rollout_s": times.rollout_s, "time_score_s": scored.seconds,
            "sync_tensors_checked": sync.tensors_checked,
            **sync_gap_columns(sync.gap),
            "time_train_s": times.train_s, "time_sync_s": times.sync_s,
            "time_sync_check_s": sync.check_seconds,
            "time_total_s": times.total_s, "time_overhead_s": times.overhead_s,
            **times.stamps, "train_started_at": train.started_at, "train_ended_at": train.ended_at,
            "sync_started_at": times.sync_started_at, "sync_ended_at": times.sync_ended_at,
        }
        if self.checkpoint_s is not None:
            row.update(time_checkpoint_s=self.checkpoint_s, checkpoint_snapshot_s=self.checkpoint_snapshot_s)
        return row
