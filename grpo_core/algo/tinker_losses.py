"""Tinker's built-in losses (`loss_fn` of `forward_backward`) as pure per-token functions of one datum.

Why not `losses.policy_loss`: a Tinker client relies on Tinker's own definitions, which differ from the GRPO family's.
Every loss is a SUM over tokens with no length or batch normalisation (a client normalises through `advantages` or
`weights`), the clip bounds are absolute ratio bounds (`clip_low_threshold=0.8`, not eps=0.2), and each datum carries
its own inputs in `loss_fn_inputs`. The server gathers the learner's log-probabilities of a datum's target tokens,
calls `elementwise_loss`, adds the sum of the result to `loss:sum` and backpropagates that sum.

The formulas, where each comes from, and what is refused: docs/guides/tinker-losses.md.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch
from torch import Tensor

SERVED_LOSSES: tuple[str, ...] = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo")

_NOT_SERVED: dict[str, str] = {
    "stable_reinforce": "it needs the sampler's stability records (samples drawn with record_stability_info=True, "
                        "named by provenance spans), which this server does not keep; use "
                        "loss_fn='importance_sampling' instead",
    "custom": "it runs a loss graph uploaded with create_custom_loss, and the server-side custom loss is off; "
              "leave custom_loss_server_side off so that forward_backward_custom computes the loss on the client "
              "and sends its gradient through 'cross_entropy'",
}

_RL_INPUTS = ("target_tokens", "logprobs", "advantages")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": _RL_INPUTS,
    "ppo": _RL_INPUTS,
    "cispo": _RL_INPUTS,
    "dro": _RL_INPUTS,
    "gspo": _RL_INPUTS + ("sequence_ratio_mask",),
}

_CLIP_DEFAULTS: dict[str, float | None] = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_CLIPPED = ("ppo", "cispo", "gspo")
# The config keys each loss takes and their defaults; None: required (Tinker documents no default).
_CONFIG: dict[str, dict[str, float | None]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": _CLIP_DEFAULTS,
    "cispo": _CLIP_DEFAULTS,
    "dro": {"beta": None},
    "gspo": _CLIP_DEFAULTS,
}


class LossInputError(ValueError):
    """A loss input missing, of the wrong shape, non-finite, or an unknown loss / config key; the message names the
    field."""


def _check_served(loss_fn: str) -> None:
    if loss_fn in _REQUIRED:
        return
    if loss_fn in _NOT_SERVED:
        raise LossInputError(f"loss_fn {loss_fn!r} is not served: {_NOT_SERVED[loss_fn]}")
    raise LossInputError(f"loss_fn {loss_fn!r} is not served; the served losses are {', '.join(SERVED_LOSSES)}")


def required_inputs(loss_fn: str) -> tuple[str, ...]:
    """The `loss_fn_inputs` names `loss_fn` needs in every datum (`target_tokens` first). Optional ones: `weights`
    (every loss), and per-token `clip_low_threshold` / `clip_high_threshold` (ppo, cispo, gspo)."""
    _check_served(loss_fn)
    return _REQUIRED[loss_fn]


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise LossInputError(f'loss_fn_config["{key}"] must be a number, got {value!r}')
    out = float(value)
    if not math.isfinite(out):
        raise LossInputError(f'loss_fn_config["{key}"] must be finite, got {out}')
    return out


def check_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float]:
    """`config` (a datum-independent `loss_fn_config`; None is empty) checked and completed with the defaults.

    ppo / cispo / gspo: clip_low_threshold (0.8) and clip_high_threshold (1.2), ratio bounds with
    0 <= low <= 1 <= high. dro: beta >= 0, required. cross_entropy / importance_sampling: no keys.
    Raises LossInputError naming the loss, or the unknown, missing or bad key.
    """
    _check_served(loss_fn)
    given = dict(config or {})
    allowed = _CONFIG[loss_fn]
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no keys"
        raise LossInputError(f"loss_fn_config has unknown key(s) {', '.join(map(repr, unknown))} for loss "
                             f"{loss_fn!r}; it takes {takes}")
    out: dict[str, float] = {}
    for key, default in allowed.items():
        if key in given:
            out[key] = _number(key, given[key])
        elif default is not None:
            out[key] = default
        else:
            raise LossInputError(f'loss_fn_config["{key}"] is missing for loss {loss_fn!r}: Tinker documents no '
                                 f'default for it (its docs only show loss_fn_config={{"beta": 0.05}}), so pass it')
    if loss_fn in _CLIPPED:
        _check_bounds(out["clip_low_threshold"], out["clip_high_threshold"], 'loss_fn_config["{}"]', "")
    if loss_fn == "dro" and out["beta"] < 0:
        raise LossInputError(f'loss_fn_config["beta"] must be >= 0 (it weighs a penalty), got {out["beta"]}')
    return out


def _check_bounds(low: float, high: float, field: str, where: str) -> None:
    """0 <= low <= 1 <= high; `field` is a format string for the field's name, `where` locates a per-token value."""
    if not 0.0 <= low <= 1.0:
        raise LossInputError(f"{field.format('clip_low_threshold')}{where} must be in [0, 1], got {low}: it is a "
                             f"bound on the ratio, not an epsilon (eps_low=0.2 is 0.8)")
    if high < 1.0:
        raise LossInputError(f"{field.format('clip_high_threshold')}{where} must be >= 1, got {high}: it is a "
                             f"bound on the ratio, not an epsilon (eps_high=0.2 is 1.2)")


def _first_bad(bad: Tensor) -> int:
    return int(bad.reshape(-1).nonzero()[0, 0])


def _checked_target(target_logprobs: Tensor) -> Tensor:
    if not isinstance(target_logprobs, Tensor) or not torch.is_floating_point(target_logprobs):
        raise LossInputError(f"target_logprobs must be a floating-point tensor, got {type(target_logprobs).__name__}"
                             + (f" of {target_logprobs.dtype}" if isinstance(target_logprobs, Tensor) else ""))
    if target_logprobs.dim() == 0:
        raise LossInputError("target_logprobs must have one entry per target token, got a 0-dim tensor")
    finite = torch.isfinite(target_logprobs.detach())
    if not bool(finite.all()):
        i = _first_bad(~finite)
        raise LossInputError(f"target_logprobs (the learner's log-probabilities of target_tokens) has a non-finite "
                             f"value {float(target_logprobs.detach().reshape(-1)[i])} at flat position {i}")
    return target_logprobs


def _checked_input(name: str, inputs: Mapping[str, Tensor], t: Tensor, loss_fn: str) -> Tensor | None:
    """inputs[name] as data (no gradient) of t's shape, dtype and device; None where it is absent."""
    if name not in inputs:
        return None
    value = inputs[name]
    field = f'loss_fn_inputs["{name}"]'
    if not isinstance(value, Tensor):
        raise LossInputError(f"{field} must be a tensor for loss {loss_fn!r}, got {type(value).__name__}")
    if value.shape != t.shape:
        raise LossInputError(f"{field} has shape {tuple(value.shape)} but target_logprobs has shape "
                             f"{tuple(t.shape)} for loss {loss_fn!r}; every input has one entry per target token")
    value = value.detach().to(device=t.device, dtype=t.dtype)
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        i = _first_bad(~finite)
        raise LossInputError(f"{field} has a non-finite value {float(value.reshape(-1)[i])} at flat position {i} "
                             f"for loss {loss_fn!r}")
    return value


def _clip_bounds(inputs: Mapping[str, Tensor], t: Tensor, loss_fn: str,
                 cfg: dict[str, float]) -> tuple[Tensor, Tensor]:
    """Per-token (low, high): the per-token inputs where given, else the config's values."""
    bounds = []
    for key in ("clip_low_threshold", "clip_high_threshold"):
        per_token = _checked_input(key, inputs, t, loss_fn)
        bounds.append(per_token if per_token is not None else torch.full_like(t.detach(), cfg[key]))
    low, high = bounds
    bad = (low < 0) | (low > 1) | (high < 1)
    if bool(bad.any()):
        i = _first_bad(bad)
        _check_bounds(float(low.reshape(-1)[i]), float(high.reshape(-1)[i]), 'loss_fn_inputs["{}"]',
                      f" (flat position {i})")
    return low, high


def _frac(hit: Tensor, active: Tensor) -> float:
    n = int(active.sum())
    return float((hit & active).sum()) / n if n else 0.0


def elementwise_loss(loss_fn: str, target_logprobs: Tensor, inputs: Mapping[str, Tensor],
                     config: Mapping[str, float] | None) -> tuple[Tensor, dict[str, float]]:
    """Tinker's per-token loss of one datum, and that datum's metrics.

    target_logprobs: [N] the learner's log p(target_tokens[i]) (with gradient in training); [N, K] top-K targets
                     work the same way, every input then being [N, K].
    inputs:          the datum's `loss_fn_inputs` except `target_tokens` (already gathered), each of
                     target_logprobs' shape: `logprobs` (the sampler's, s), `advantages` (A), `sequence_ratio_mask`,
                     optional `weights` (w) and per-token `clip_low_threshold` / `clip_high_threshold` (they replace
                     the config's for ppo, cispo, gspo). Inputs the loss does not read are ignored.
    config:          `loss_fn_config`, checked by `check_config`.

    With t = target_logprobs, lo/hi the clip bounds and sg() stop-gradient:
      cross_entropy:       -t * w                       (w = 1 where weights are absent; any sign)
      importance_sampling: -r * A,                      r = exp(t - s)
      ppo:                 -min(r * A, clip(r, lo, hi) * A)
      cispo:               -sg(clip(r, lo, hi)) * t * A
      dro:                 -(t * A - beta/2 * (t - s)^2)
      gspo:                -min(r_t * A, clip(r_t, lo, hi) * A), r_t = exp(L + t - sg(t)),
                           L = mean over sequence_ratio_mask != 0 of (sg(t) - s)   (GSPO-token)
    Every RL loss is then multiplied by w only where weights are given. No log-ratio is clamped.

    Returns the per-token loss (target_logprobs' shape, differentiable; the caller sums it) and metrics:
    active_tokens (tokens with A != 0), clip_low_frac / clip_high_frac (ppo, gspo: fraction of active tokens on the
    clipped, zero-gradient branch, A < 0 with r < lo and A > 0 with r > hi; cispo: active tokens whose ratio was
    raised to lo / lowered to hi), and for gspo sequence_ratio (exp(L)) and ratio_tokens (|mask|).
    Raises LossInputError naming the field.
    """
    cfg = check_config(loss_fn, config)
    t = _checked_target(target_logprobs)
    x: dict[str, Tensor] = {}
    for name in _REQUIRED[loss_fn]:
        if name == "target_tokens":
            continue
        value = _checked_input(name, inputs, t, loss_fn)
        if value is None:
            raise LossInputError(f'loss_fn_inputs["{name}"] is missing for loss {loss_fn!r} (it needs '
                                 f"{', '.join(_REQUIRED[loss_fn])})")
        x[name] = value
    weights = _checked_input("weights", inputs, t, loss_fn)

    if loss_fn == "cross_entropy":
        return -t * (weights if weights is not None else torch.ones_like(t.detach())), {}

    s, adv = x["logprobs"], x["advantages"]
    active = adv != 0
    metrics: dict[str, float] = {"active_tokens": float(active.sum())}
    if loss_fn == "importance_sampling":
        per_token = -(torch.exp(t - s) * adv)
    elif loss_fn == "dro":
        per_token = -(t * adv - 0.5 * cfg["beta"] * (t - s) ** 2)
    else:
        low, high = _clip_bounds(inputs, t, loss_fn, cfg)
        if loss_fn == "gspo":
            in_ratio = x["sequence_ratio_mask"] != 0
            if not bool(in_ratio.any()):
                raise LossInputError('loss_fn_inputs["sequence_ratio_mask"] has no nonzero entry for loss '
                                     "'gspo': the sequence ratio is a mean over the tokens it marks")
            log_ratio = (t.detach() - s)[in_ratio].mean()
            ratio = torch.exp(log_ratio + t - t.detach())
            metrics |= {"sequence_ratio": float(torch.exp(log_ratio)), "ratio_tokens": float(in_ratio.sum())}
        else:
            ratio = torch.exp(t - s)
        clipped = torch.clamp(ratio, min=low, max=high)
        r = ratio.detach()
        if loss_fn == "cispo":
            per_token = -(clipped.detach() * t * adv)
            metrics |= {"clip_low_frac": _frac(r < low, active), "clip_high_frac": _frac(r > high, active)}
        else:
            per_token = -torch.minimum(ratio * adv, clipped * adv)
            metrics |= {"clip_low_frac": _frac((adv < 0) & (r < low), active),
                        "clip_high_frac": _frac((adv > 0) & (r > high), active)}
    if weights is not None:
        per_token = per_token * weights
    return per_token, metrics
