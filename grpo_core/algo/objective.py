"""The objectives of one micro-batch, each whole and a pure function of tensors and the algorithm config: the
policy objective (off-policy correction, clipped policy gradient, KL to the reference and the entropy bonus) and the
supervised one (the negative log-likelihood of the target tokens, for SFT).

Why functions behind one interface: the learner's step owns forward, backward and the optimizer, nothing of the
loss; a new objective is another function beside these, chosen by ``make_objective`` from the run's objective kind
(``GRPOConfig.objective``), not an edit of the step; a term added to any of them (a distillation teacher's top-K
KL) wraps it. ``tests/test_algo_objective.py`` holds the policy objective to float rounding against the loss the
learner assembled inline before (saved batches).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from grpo_core.algo.distill import top_k_forward_kl
from grpo_core.algo.kl import kl_penalty
from grpo_core.algo.losses import aggregate_loss, policy_loss
from grpo_core.algo.offpolicy import offpolicy_weights

if TYPE_CHECKING:
    from grpo_core.config import AlgoConfig


def policy_objective(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                     algo: "AlgoConfig", *, entropy: Tensor, denominator: float, norm_length: int,
                     sampler_logprobs: Tensor | None = None,
                     ref_logprobs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The loss to backpropagate for one micro-batch, and its metrics.

    logprobs:         [B, T] log pi_theta of the sampled tokens (with gradient).
    old_logprobs:     [B, T] log pi_old (detached), the policy the advantages were computed for.
    advantages:       [B] (or [B, T]).
    mask:             [B, T] 1 on the response tokens the policy is trained on.
    entropy:          [B, T] the policy's entropy per token (with gradient when ``algo.entropy_coeff`` > 0).
    denominator:      what the mini-batch's aggregation divides by (``loss_denominator`` over the whole mini-batch).
    norm_length:      the constant length of ``seq_mean_token_sum_norm``.
    sampler_logprobs: [B, T] log pi_sampler, when the rows carry them: the off-policy correction
                      (``algo.offpolicy``) and the sampler/learner mismatch metrics; None: neither.
    ref_logprobs:     [B, T] log pi_ref, when the run has a reference: the KL penalty (unless ``algo.kl_in_reward``).

    Metrics: the correction's (``offpolicy_*``, ``mismatch_*``: ``mismatch_abs_logp_max`` is a max, the caller
    reduces it so), the policy gradient's (its loss as ``pg_loss``), ``kl_ref`` with a reference, and ``entropy``.
    """
    metrics: dict[str, float] = {}
    is_weights = None
    if sampler_logprobs is not None:
        is_weights, corrections = offpolicy_weights(
            old_logprobs, sampler_logprobs, mask, algo.offpolicy or "none", advantages=advantages,
            cap=algo.tis_cap or 0.0, band=algo.offpolicy_band, kl_threshold=algo.offpolicy_kl_threshold)
        metrics.update(corrections)
    loss, pg = policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high,
        ratio_level=algo.ratio_level, dual_clip=algo.dual_clip, skip_threshold=algo.skip_threshold,
        agg_mode=algo.loss_agg_mode, norm_length=norm_length, is_weights=is_weights, global_denominator=denominator)
    metrics.update({"pg_loss" if k == "loss" else k: v for k, v in pg.items()})
    if ref_logprobs is not None and not algo.kl_in_reward:
        kl, _ = kl_penalty(logprobs, ref_logprobs, estimator=algo.kl_estimator, mask=mask)
        loss = loss + algo.kl_coeff * aggregate_loss(kl, mask, algo.loss_agg_mode, norm_length=norm_length,
                                                     global_denominator=denominator)
        metrics["kl_ref"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
    if algo.entropy_coeff > 0:  # entropy bonus: maximise entropy, aggregated like the loss
        loss = loss - algo.entropy_coeff * aggregate_loss(entropy, mask, algo.loss_agg_mode, norm_length=norm_length,
                                                          global_denominator=denominator)
    metrics["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
    return loss, metrics


def supervised_objective(logprobs: Tensor, mask: Tensor, *, entropy: Tensor, denominator: float,
                         agg_mode: str = "token_mean", norm_length: int | None = None
                         ) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning: the negative log-likelihood of the target tokens (an SFT row's assistant turns).

    logprobs:    [B, T] log pi_theta of the row's tokens (with gradient), at temperature 1.
    mask:        [B, T] 1 on the tokens the loss is on (assistant turns), 0 elsewhere (system, user, tool turns).
    entropy:     [B, T] the policy's entropy per token (a metric only).
    denominator: what the mini-batch's aggregation divides by (``loss_denominator`` over the whole mini-batch:
                 with ``token_mean`` the mini-batch's target tokens, so the micro-batches' losses sum to the
                 cross-entropy averaged over every target token of the mini-batch, as TRL's SFT loss).

    Metrics: ``nll`` (this micro-batch's mean negative log-likelihood per target token) and ``entropy``."""
    nll = -logprobs
    loss = aggregate_loss(nll, mask, agg_mode, norm_length=norm_length, global_denominator=denominator)
    tokens = mask.sum().clamp(min=1)
    return loss, {"nll": float((nll.detach() * mask).sum() / tokens),
                  "entropy": float((entropy.detach() * mask).sum() / tokens)}


@dataclass(frozen=True)
class ObjectiveInputs:
    """What the learner's step has for one micro-batch (every tensor [B, T] but ``advantages``: [B] or [B, T])."""
    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    entropy: Tensor
    denominator: float
    norm_length: int
    sampler_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    student_top_logprobs: Tensor | None = None  # [B, T, K] at a distillation teacher's top-K tokens
    teacher_top_logprobs: Tensor | None = None  # [B, T, K] the teacher's logprobs of them


class Objective(Protocol):
    """The loss of one micro-batch and its metrics (see ``ObjectiveInputs``)."""

    uses_old_logprobs: bool  # whether the step must compute pi_old before its first update (several steps)

    @property
    def agg_mode(self) -> str:
        """How the loss is aggregated over a mini-batch (``grpo_core.algo.losses.AGG_MODES``): the step computes
        the mini-batch's denominator with it."""

    def __call__(self, x: ObjectiveInputs) -> tuple[Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class PolicyGradient:
    """RL: ``policy_objective`` with the run's algorithm settings."""
    algo: "AlgoConfig"
    uses_old_logprobs: bool = True

    @property
    def agg_mode(self) -> str:
        return self.algo.loss_agg_mode

    def __call__(self, x: ObjectiveInputs) -> tuple[Tensor, dict[str, float]]:
        return policy_objective(x.logprobs, x.old_logprobs, x.advantages, x.mask, self.algo, entropy=x.entropy,
                                denominator=x.denominator, norm_length=x.norm_length,
                                sampler_logprobs=x.sampler_logprobs, ref_logprobs=x.ref_logprobs)


@dataclass(frozen=True)
class Supervised:
    """SFT: ``supervised_objective`` averaged over every target token of the mini-batch (the cross-entropy as
    TRL's and every SFT trainer's; ``algo.loss_agg_mode`` is the policy gradient's); no advantage, pi_old or
    reference."""
    algo: "AlgoConfig"
    uses_old_logprobs: bool = False
    agg_mode: str = "token_mean"

    def __call__(self, x: ObjectiveInputs) -> tuple[Tensor, dict[str, float]]:
        return supervised_objective(x.logprobs, x.mask, entropy=x.entropy, denominator=x.denominator,
                                    agg_mode=self.agg_mode, norm_length=x.norm_length)


@dataclass(frozen=True)
class WithTeacherTopK:
    """An objective plus ``weight`` x ``top_k_forward_kl`` (on-policy distillation with ``distill.top_k``), the
    term aggregated as the inner objective's loss. A micro-batch without the teacher's top K gets the inner loss."""
    inner: Objective
    weight: float

    @property
    def uses_old_logprobs(self) -> bool:
        return self.inner.uses_old_logprobs

    @property
    def agg_mode(self) -> str:
        return self.inner.agg_mode

    def __call__(self, x: ObjectiveInputs) -> tuple[Tensor, dict[str, float]]:
        loss, metrics = self.inner(x)
        if x.student_top_logprobs is None or x.teacher_top_logprobs is None:
            return loss, metrics
        kl, kl_metrics = top_k_forward_kl(x.student_top_logprobs, x.teacher_top_logprobs, x.mask,
                                          agg_mode=self.agg_mode, denominator=x.denominator,
                                          norm_length=x.norm_length)
        return loss + self.weight * kl, {**metrics, **kl_metrics}


OBJECTIVES = {"policy_gradient": PolicyGradient, "sft": Supervised}


def make_objective(kind: str, algo: "AlgoConfig", teacher_top_k_weight: float = 0.0) -> Objective:
    """The objective of kind ``kind`` (one of ``OBJECTIVES``; a run's ``GRPOConfig.objective``), with the run's
    algorithm settings; with ``teacher_top_k_weight`` > 0 (``GRPOConfig.teacher_top_k_weight``) the top-K forward
    KL to a distillation teacher added (``WithTeacherTopK``)."""
    if kind not in OBJECTIVES:
        raise ValueError(f"unknown objective {kind!r}; choose one of {sorted(OBJECTIVES)}")
    objective = OBJECTIVES[kind](algo)
    return WithTeacherTopK(objective, teacher_top_k_weight) if teacher_top_k_weight > 0 else objective
