"""Correcting for the gap between the sampler (vLLM) and the learner's old policy.

Even on-policy, the sampler's logprobs differ from the learner's (kernels, precision); with async rollouts the
sampler's weights are also stale. Truncated importance sampling (TIS) reweights each token's loss by
w_t = min(pi_old(y_t) / pi_sampler(y_t), cap), detached, which bounds the variance the correction can add.
The mismatch metrics show how far the two engines are apart (a jump usually means a broken weight sync).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grpo_core.algo.masked import check_same_shape, masked_max, masked_mean

_LOG_LIMIT = 20.0


def _log_ratio(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(bool mask, log(pi_old / pi_sampler) with 0 outside the mask, the same clamped to +-_LOG_LIMIT)."""
    m = mask.to(torch.bool)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    delta = torch.where(m, old_logprobs - sampler_logprobs, zero)
    return m, delta, delta.clamp(-_LOG_LIMIT, _LOG_LIMIT)


def _mismatch_metrics(m: Tensor, delta: Tensor, clamped: Tensor, ratio: Tensor) -> dict[str, float]:
    return {"mismatch_abs_logp_mean": float(masked_mean(delta.abs(), m)),
            "mismatch_abs_logp_max": float(masked_max(delta.abs(), m)),
            "mismatch_k3": float(masked_mean(ratio - clamped - 1.0, m))}


def sampler_mismatch(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's logprobs of the sampled tokens are from the learner's before the update.

    old_logprobs, sampler_logprobs, mask: [B, T]. Returns mismatch_abs_logp_mean and mismatch_abs_logp_max (|old -
    sampler| over the masked tokens) and mismatch_k3 (k3 estimate of KL(sampler || old), token mean). On-policy
    these measure the two engines' numerical agreement on every token of the batch, so a broken weight sync shows
    at once; off-policy they also hold how far the policy moved since the sampler's weights."""
    check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)
    with torch.no_grad():
        m, delta, clamped = _log_ratio(old_logprobs, sampler_logprobs, mask)
        return _mismatch_metrics(m, delta, clamped, torch.exp(clamped))


def truncated_is_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor,
                         cap: float, mode: str = "truncate") -> tuple[Tensor, dict[str, float]]:
    """TIS weights and sampler/learner mismatch metrics.

    old_logprobs: [B, T] learner's log pi_old of the sampled tokens; sampler_logprobs: [B, T] the sampler's;
    mask: [B, T] real tokens. cap: bound of the weights (> 0; 2 in Yao et al.). mode: "truncate" (TIS,
    min(w, cap)) or "mask" (AReaL's decoupled objective: a token whose w exceeds cap gets weight 0, the others w;
    pi_old plays AReaL's proximal policy).
    Returns (weights [B, T] = min(exp(old - sampler), cap) (or the masked w), detached, 0 outside the mask; metrics:
      ``sampler_mismatch``'s, tis_capped_frac (tokens whose weight hit the cap), tis_weight_mean, tis_weight_max).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
    if old_logprobs.dim() != 2:
        raise ValueError(f"old_logprobs must be [B, T], got shape {tuple(old_logprobs.shape)}")
    check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)
    with torch.no_grad():
        m, delta, clamped = _log_ratio(old_logprobs, sampler_logprobs, mask)
        raw = torch.exp(clamped)
        zero = torch.zeros((), dtype=raw.dtype, device=raw.device)
        kept = raw.clamp(max=cap) if mode == "truncate" else torch.where(raw > cap, zero, raw)
        weights = torch.where(m, kept, zero)
        metrics = {
            **_mismatch_metrics(m, delta, clamped, raw),
            "tis_capped_frac": float(masked_mean((raw > cap).to(raw.dtype), m)),
            "tis_weight_mean": float(masked_mean(weights, m)),
            "tis_weight_max": float(masked_max(weights, m)),
        }
    return weights, metrics
