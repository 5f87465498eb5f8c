"""Correcting for the gap between the sampler (vLLM) and the learner's old policy.

Even on-policy, the sampler's logprobs differ from the learner's (kernels, precision); with async rollouts the
sampler's weights are also stale. Each correction turns the per-token log ratio log(pi_old / pi_sampler) of the
sampled tokens into detached per-token weights that multiply the policy loss: a weight of 0 is a mask. The kinds
and where they come from:

  tis           token TIS (Yao et al.): w_t = min(rho_t, cap)
  seq_tis       sequence TIS (verl rollout_is=sequence): every token of a row gets min(prod_t rho_t, cap)
  icepop        IcePop (Ring-1T; SkyRL, OpenRLHF): w_t = rho_t inside [low, high], 0 outside (two-sided token mask)
  seq_mis       sequence MIS (slime, verl rollout_rs=sequence): the row keeps weight prod_t rho_t inside
                [low, high], else 0
  geo_mask      geometric rejection (verl rollout_rs=geometric): the row is masked when the geometric mean of its
                token ratios leaves [low, high], else weight 1 (no reweighting)
  neg_adv_mask  DeepSeek-V3.2's off-policy sequence masking (TRL off_policy_mask_threshold): a row with a negative
                advantage whose mean log(pi_sampler / pi_old) exceeds a threshold is masked, others weight 1
  decoupled     AReaL's decoupled objective: w_t = rho_t, 0 where rho_t > cap

A masked token still counts in the loss's denominator (AReaL's convention; verl removes it): masking lowers the
batch's step size rather than renormalising onto the kept rows. The mismatch metrics show how far the two engines
are apart (a jump usually means a broken weight sync).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grpo_core.algo.masked import check_same_shape, masked_max, masked_mean

_LOG_LIMIT = 20.0

KINDS = ("none", "tis", "seq_tis", "icepop", "seq_mis", "geo_mask", "neg_adv_mask", "decoupled")


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


def _check_cap(cap: float) -> None:
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")


def _check(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> None:
    if old_logprobs.dim() != 2:
        raise ValueError(f"old_logprobs must be [B, T], got shape {tuple(old_logprobs.shape)}")
    check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)


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


def _result(weights: Tensor, m: Tensor, masked: Tensor, capped: Tensor,
            mismatch: dict[str, float]) -> tuple[Tensor, dict[str, float]]:
    """Weights zeroed outside the mask, and the metrics every kind reports (token shares over the real tokens)."""
    zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
    weights = torch.where(m, weights, zero)
    return weights, {**mismatch,
                     "offpolicy_weight_mean": float(masked_mean(weights, m)),
                     "offpolicy_weight_max": float(masked_max(weights, m)),
                     "offpolicy_masked_frac": float(masked_mean((masked & m).to(weights.dtype), m)),
                     "offpolicy_capped_frac": float(masked_mean((capped & m).to(weights.dtype), m))}


def truncated_is_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor,
                         cap: float, mode: str = "truncate") -> tuple[Tensor, dict[str, float]]:
    """Token TIS weights (``tis``) or AReaL's decoupled mask (``decoupled``), and the mismatch metrics.

    old_logprobs: [B, T] learner's log pi_old of the sampled tokens; sampler_logprobs: [B, T] the sampler's;
    mask: [B, T] real tokens. cap: bound of the weights (> 0; 2 in Yao et al.). mode: "truncate" (TIS,
    min(w, cap)) or "mask" (a token whose w exceeds cap gets weight 0, the others w; pi_old plays AReaL's proximal
    policy).
    Returns (weights [B, T], detached, 0 outside the mask; metrics: ``sampler_mismatch``'s, offpolicy_capped_frac
    (tokens whose ratio exceeded the cap), offpolicy_masked_frac (tokens given weight 0: those in "mask" mode),
    offpolicy_weight_mean, offpolicy_weight_max)."""
    _check_cap(cap)
    if mode not in ("truncate", "mask"):
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
    _check(old_logprobs, sampler_logprobs, mask)
    with torch.no_grad():
        m, delta, clamped = _log_ratio(old_logprobs, sampler_logprobs, mask)
        raw = torch.exp(clamped)
        over = raw > cap
        zero = torch.zeros((), dtype=raw.dtype, device=raw.device)
        kept = raw.clamp(max=cap) if mode == "truncate" else torch.where(over, zero, raw)
        masked = over if mode == "mask" else torch.zeros_like(over)
        return _result(kept, m, masked, over, _mismatch_metrics(m, delta, clamped, raw))


def _band(band: tuple[float, float]) -> tuple[float, float]:
    low, high = band
    if not 0.0 < low <= 1.0 <= high:
        raise ValueError(f"band must satisfy 0 < low <= 1 <= high, got {band}")
    return low, high


def _sequence_log_ratio(delta: Tensor) -> Tensor:
    """[B]: log prod_t rho_t over each row's real tokens (``delta`` is 0 elsewhere), clamped to +-_LOG_LIMIT."""
    return delta.sum(dim=-1).clamp(-_LOG_LIMIT, _LOG_LIMIT)


def offpolicy_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, kind: str, *,
                      advantages: Tensor | None = None, cap: float = 2.0, band: tuple[float, float] = (0.5, 2.0),
                      kl_threshold: float = 0.1) -> tuple[Tensor | None, dict[str, float]]:
    """The off-policy correction ``kind`` (see the module docstring) as per-token loss weights.

    old_logprobs, sampler_logprobs, mask: [B, T] (log pi_old and log pi_sampler of the sampled tokens; real
    tokens). advantages: [B], read by neg_adv_mask. cap: tis, seq_tis and decoupled. band: (low, high) with
    low <= 1 <= high, for icepop, seq_mis and geo_mask. kl_threshold: nats per token, for neg_adv_mask.
    Returns (weights [B, T] detached, 0 outside the mask, or None for "none"; metrics: the mismatch metrics and,
    for every kind but "none", offpolicy_weight_mean / _max, offpolicy_masked_frac (tokens given weight 0 by the
    rule) and offpolicy_capped_frac (tokens whose weight the cap lowered))."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "none":
        return None, sampler_mismatch(old_logprobs, sampler_logprobs, mask)
    if kind in ("tis", "decoupled"):
        return truncated_is_weights(old_logprobs, sampler_logprobs, mask, cap,
                                    mode="truncate" if kind == "tis" else "mask")
    _check(old_logprobs, sampler_logprobs, mask)
    with torch.no_grad():
        m, delta, clamped = _log_ratio(old_logprobs, sampler_logprobs, mask)
        raw = torch.exp(clamped)
        mismatch = _mismatch_metrics(m, delta, clamped, raw)
        none = torch.zeros_like(m)
        if kind == "seq_tis":
            _check_cap(cap)
            seq = torch.exp(_sequence_log_ratio(delta))[:, None].expand_as(raw)
            return _result(seq.clamp(max=cap), m, none, seq > cap, mismatch)
        if kind == "neg_adv_mask":
            if advantages is None or advantages.shape != old_logprobs.shape[:1]:
                raise ValueError(f"neg_adv_mask needs advantages of shape [B] = {tuple(old_logprobs.shape[:1])}, "
                                 f"got {None if advantages is None else tuple(advantages.shape)}")
            kl = masked_mean(-delta, m, dim=-1)  # mean log(pi_sampler / pi_old) per row
            dropped = ((advantages.to(kl.device) < 0) & (kl > kl_threshold))[:, None].expand_as(m)
            return _result((~dropped).to(raw.dtype), m, dropped, none, mismatch)
        low, high = _band(band)
        if kind == "icepop":
            outside = (raw < low) | (raw > high)
            return _result(torch.where(outside, torch.zeros_like(raw), raw), m, outside, none, mismatch)
        if kind == "seq_mis":
            seq = torch.exp(_sequence_log_ratio(delta))
            outside = ((seq < low) | (seq > high))[:, None].expand_as(m)
            weights = torch.where(outside, torch.zeros_like(raw), seq[:, None].expand_as(raw))
            return _result(weights, m, outside, none, mismatch)
        geo = torch.exp(masked_mean(delta, m, dim=-1))  # geo_mask
        outside = ((geo < low) | (geo > high))[:, None].expand_as(m)
        return _result((~outside).to(raw.dtype), m, outside, none, mismatch)
