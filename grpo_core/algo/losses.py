"""The clipped policy-gradient loss of the GRPO family, and how per-token losses become one scalar.

One function covers GRPO, DAPO (asymmetric clip-higher, token-mean), Dr.GRPO (constant normaliser), GSPO (sequence
ratio) and the stabilisers (dual clip, ratio skip, truncated importance weights). The variants differ only in
options, so a run's algorithm is fully described by its config.

Aggregation and gradient accumulation: a mini-batch (one optimizer step) is often split into micro-batches. To make
the sum of the micro-batch losses equal the mini-batch loss, pass `global_denominator` = `loss_denominator(mask of
the whole mini-batch, mode)` to every micro-batch call. Without it each call normalises by its own tokens/sequences.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from grpo_core.algo.masked import check_same_shape, masked_max, masked_mean

AggMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
AGG_MODES: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
RatioLevel = Literal["token", "sequence"]

# exp() of a log-ratio beyond this overflows or dominates; clamping keeps the loss finite (gradient 0 beyond it).
_LOG_RATIO_LIMIT = 20.0


def loss_denominator(mask: Tensor, mode: AggMode) -> float:
    """What `mode` divides by, computed over `mask` [B, T]: the number of real tokens for "token_mean", the number
    of sequences with at least one real token for the seq_* modes. Compute it over a whole mini-batch and pass it
    as `global_denominator` to each micro-batch."""
    if mode not in AGG_MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {AGG_MODES}")
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    m = mask.to(torch.bool)
    if mode == "token_mean":
        return float(m.sum())
    return float(m.any(dim=1).sum())


def aggregate_loss(values: Tensor, mask: Tensor, mode: AggMode = "token_mean", norm_length: int | None = None,
                   global_denominator: float | None = None) -> Tensor:
    """Reduce per-token values [B, T] to a scalar over the real tokens (mask [B, T], bool or 0/1).

    - "token_mean":              sum_{i,t} v / D,  D = number of real tokens.
    - "seq_mean_token_mean":     sum_i (sum_t v / |y_i|) / D,  D = number of non-empty sequences (GRPO paper, GSPO).
    - "seq_mean_token_sum":      sum_i sum_t v / D,  D = number of non-empty sequences.
    - "seq_mean_token_sum_norm": sum_{i,t} v / (D * norm_length), D = number of non-empty sequences (Dr.GRPO: a
      constant per-sequence normaliser, e.g. max_new_tokens, instead of the sequence's own length; as TRL's
      `dr_grpo` loss and verl's "seq-mean-token-sum-norm").
    global_denominator: replaces D (token or sequence count of the whole mini-batch; see `loss_denominator`).
    Empty masks give 0 (never NaN).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"mode={mode!r} is unknown; choose one of {AGG_MODES}")
    if values.dim() != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(values.shape)}")
    check_same_shape(values=values, mask=mask)
    if global_denominator is not None and global_denominator <= 0:
        raise ValueError(f"global_denominator must be > 0, got {global_denominator}")
    m = mask.to(torch.bool)
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    if mode == "token_mean":
        denom = global_denominator if global_denominator is not None else m.sum().clamp(min=1)
        return v.sum() / denom
    tokens = m.sum(dim=1)
    denom = global_denominator if global_denominator is not None else (tokens > 0).sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return (v.sum(dim=1) / tokens.clamp(min=1)).sum() / denom
    if mode == "seq_mean_token_sum":
        return v.sum() / denom
    if norm_length is None or norm_length <= 0:
        raise ValueError(f"mode='seq_mean_token_sum_norm' needs norm_length >= 1 (Dr.GRPO's constant, usually "
                         f"max_new_tokens), got norm_length={norm_length}")
    return v.sum() / (denom * norm_length)


def _checked_advantages(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                        is_weights: Tensor | None) -> Tensor:
    """The advantages as [B, T] (a [B] one is broadcast over each row), after the shapes are checked."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, is_weights=is_weights)
    if advantages.dim() == 1:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} entries but logprobs has batch size "
                             f"{logprobs.shape[0]}")
        return advantages[:, None].expand_as(logprobs)
    if advantages.shape == logprobs.shape:
        return advantages
    raise ValueError(f"advantages must be [B] or [B, T] = {tuple(logprobs.shape)}, got {tuple(advantages.shape)}")


def _check_surrogate_options(ratio_level: str, clip_eps_low: float, clip_eps_high: float, dual_clip: float | None,
                             skip_threshold: float | None, agg_mode: str) -> None:
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level={ratio_level!r} is unknown; choose 'token' or 'sequence'")
    if not 0.0 <= clip_eps_low < 1.0:
        raise ValueError(f"clip_eps_low must be in [0, 1), got {clip_eps_low}")
    if clip_eps_high < 0.0:
        raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it caps negative-advantage losses at dual_clip*|A|), got {dual_clip}")
    if skip_threshold is not None and skip_threshold <= 1.0:
        raise ValueError(f"skip_threshold must be > 1, got {skip_threshold}")
    if agg_mode not in AGG_MODES:
        raise ValueError(f"agg_mode={agg_mode!r} is unknown; choose one of {AGG_MODES}")


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                clip_eps_low: float = 0.2, clip_eps_high: float = 0.2, ratio_level: RatioLevel = "token",
                dual_clip: float | None = None, skip_threshold: float | None = None,
                agg_mode: AggMode = "token_mean", norm_length: int | None = None, is_weights: Tensor | None = None,
                global_denominator: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss (to minimise) and its diagnostics.

    logprobs:     [B, T] log pi_theta(y_t) of the sampled tokens, with gradient.
    old_logprobs: [B, T] log pi_old(y_t), the policy the advantages were computed for (no gradient).
    advantages:   [B] one per sequence (or [B, T] per token).
    mask:         [B, T] bool/0-1, true on response tokens.
    ratio_level:  "token": r_t = exp(logp_t - old_t).
                  "sequence" (GSPO): s = exp(mean_t(logp_t - old_t)); each token uses sg(s) * exp(logp_t - sg(logp_t)),
                  whose value is s and whose gradient is s * grad logp_t (GSPO-token with a sequence advantage equals
                  GSPO). Clipping, dual clip and skipping then act per sequence.
    Per token: L = max(-A r, -A clip(r, 1 - clip_eps_low, 1 + clip_eps_high)).
    dual_clip c (> 1): for A < 0, L = min(L, -c A) (the loss of a negative-advantage token is capped at c|A|).
    skip_threshold: tokens (sequences, at sequence level) whose ratio exceeds it get loss 0; they still count in the
      denominator, so skipping never re-weights the other tokens and micro-batch sums stay exact.
    is_weights: [B, T] truncated IS weights (see offpolicy.truncated_is_weights), multiplied into L, detached.
    agg_mode / norm_length / global_denominator: see `aggregate_loss`.
    Log-ratios are clamped to +-20 before exp() so the loss stays finite.

    Returns (scalar loss, metrics): clipfrac_low (r < 1-eps_low with A < 0), clipfrac_high (r > 1+eps_high with
    A > 0), clipfrac (their sum), approx_kl (k3 estimate of KL to the old policy, token mean), ratio_mean,
    ratio_max, skipped_frac, dual_clip_frac (A < 0 and r > c), pg_loss; fractions are over real tokens.
    """
    adv = _checked_advantages(logprobs, old_logprobs, advantages, mask, is_weights)
    _check_surrogate_options(ratio_level, clip_eps_low, clip_eps_high, dual_clip, skip_threshold, agg_mode)

    m = mask.to(torch.bool)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    adv = adv.detach().to(logprobs.dtype)
    old = old_logprobs.detach()
    token_log_ratio = torch.where(m, logprobs - old, zero)
    if ratio_level == "token":
        log_ratio = token_log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    else:
        seq_log_ratio = masked_mean(token_log_ratio.detach(), m, dim=1).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
        lp = torch.where(m, logprobs, zero)
        log_ratio = seq_log_ratio[:, None] + lp - lp.detach()
    ratio = torch.exp(log_ratio)

    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    r = ratio.detach()
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
        dual_hit = m & (adv < 0) & (r > dual_clip)
    else:
        dual_hit = torch.zeros_like(m)
    if skip_threshold is not None:
        skipped = m & (r > skip_threshold)
        per_token = torch.where(skipped, zero, per_token)
    else:
        skipped = torch.zeros_like(m)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)

    loss = aggregate_loss(per_token, m, agg_mode, norm_length=norm_length, global_denominator=global_denominator)

    with torch.no_grad():
        fm = m.to(r.dtype)
        low = (m & (r < 1.0 - clip_eps_low) & (adv < 0)).to(r.dtype)
        high = (m & (r > 1.0 + clip_eps_high) & (adv > 0)).to(r.dtype)
        d = -token_log_ratio.detach().clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)  # old - new
        k3 = torch.exp(d) - d - 1.0
        metrics = {
            "pg_loss": float(loss.detach()),
            "clipfrac_low": float(masked_mean(low, fm)),
            "clipfrac_high": float(masked_mean(high, fm)),
            "clipfrac": float(masked_mean(low + high, fm)),
            "approx_kl": float(masked_mean(k3, m)),
            "ratio_mean": float(masked_mean(r, m)),
            "ratio_max": float(masked_max(r, m)),
            "skipped_frac": float(masked_mean(skipped.to(r.dtype), m)),
            "dual_clip_frac": float(masked_mean(dual_hit.to(r.dtype), m)),
        }
    return loss, metrics
