"""The policy objective of one micro-batch, whole: off-policy correction, clipped policy gradient, KL to the
reference and the entropy bonus, as one pure function of tensors and the algorithm config.

Why one function: the learner's step owns forward, backward and the optimizer, nothing of the loss; a new objective
(distillation, SFT) is another function beside this one, not an edit of the step. ``tests/test_algo_objective.py``
holds it to the bit against the loss the learner assembled inline before (saved batches).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from grpo_core.algo.kl import kl_penalty
from grpo_core.algo.losses import aggregate_loss, policy_loss
from grpo_core.algo.offpolicy import offpolicy_weights

if TYPE_CHECKING:
    from grpo_core.config_sections import AlgoConfig


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
