"""KL regularisation towards a reference policy, estimated per token from the sampled tokens.

With tokens sampled from pi_theta and delta = log pi_theta - log pi_ref (Schulman's estimators):
  k1 = delta                                   unbiased for KL(pi_theta || pi_ref), high variance, can be negative
  k2 = 0.5 * delta^2                           biased, low variance, >= 0
  k3 = exp(-delta) - (-delta) - 1              unbiased, low variance, >= 0 (GRPO's choice)
The penalty either enters the loss (`kl_coeff * aggregate_loss(kl)`) or the reward (`apply_kl_to_reward`).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from grpo_core.algo.masked import check_same_shape, masked_mean, masked_sum

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
# exp(ref - logp) overflows for large gaps; verl clamps the same way.
_K3_LOG_LIMIT = 20.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator = "k3",
               mask: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Per-token KL estimates.

    logprobs, ref_logprobs: [B, T] log-probabilities of the sampled tokens under the policy (with gradient) and the
      reference (detached here). mask: optional [B, T]; positions outside it are 0 and metrics ignore them.
    Returns (kl [B, T], {"kl_mean": token mean, "kl_max": max}); k3's exponent is clamped to +-20.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator={estimator!r} is unknown; choose one of {KL_ESTIMATORS}")
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, mask=mask)
    m = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    delta = torch.where(m, logprobs - ref_logprobs.detach(), zero)
    if estimator == "k1":
        kl = delta
    elif estimator == "k2":
        kl = 0.5 * delta.square()
    else:
        neg = (-delta).clamp(-_K3_LOG_LIMIT, _K3_LOG_LIMIT)
        kl = torch.exp(neg) - neg - 1.0
    kl = torch.where(m, kl, zero)
    with torch.no_grad():
        metrics = {"kl_mean": float(masked_mean(kl, m)),
                   "kl_max": float(kl[m].max()) if bool(m.any()) else 0.0}
    return kl, metrics


def apply_kl_to_reward(rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coeff: float,
                       estimator: KLEstimator = "k1") -> tuple[Tensor, dict[str, float]]:
    """KL in the reward: r' = r - coeff * sum_t kl_t over each sequence's real tokens (no gradient).

    rewards: [B]; logprobs, ref_logprobs, mask: [B, T]. Returns (shaped rewards [B], metrics with kl_seq_mean).
    """
    if coeff < 0:
        raise ValueError(f"coeff must be >= 0, got {coeff}")
    if rewards.dim() != 1 or rewards.shape[0] != logprobs.shape[0]:
        raise ValueError(f"rewards must be [B] with B = {logprobs.shape[0]}, got shape {tuple(rewards.shape)}")
    with torch.no_grad():
        kl, km = kl_penalty(logprobs.detach(), ref_logprobs, estimator, mask)
        seq_kl = masked_sum(kl, mask, dim=1)
        shaped = rewards - coeff * seq_kl.to(rewards.dtype)
    return shaped, {"kl_seq_mean": float(seq_kl.mean()), "kl_mean": km["kl_mean"],
                    "kl_reward_penalty_mean": float((coeff * seq_kl).mean())}
