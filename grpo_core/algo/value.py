"""PPO with a learned value function (a critic): token rewards, GAE advantages and returns, whitening, the clipped
value loss and the critic's explained variance, as pure tensor functions.

Why these and not group baselines: with a critic every sampled answer has its own baseline V(s_t) at every token,
so a prompt needs no group of G answers (G = 1 works) and credit moves along the answer by the TD errors. The
definitions are verl's (``trainer/ppo/core_algos.py``: ``compute_gae_advantage_return``, ``compute_value_loss``,
``utils/torch_functional.masked_whiten``), themselves TRL's PPO trainer's; ``tests/test_algo_value.py`` holds these
to verl's outputs and gradients on saved tensors (``benchmarks/verl_value_reference.py`` makes them with verl).

Every tensor is on the learner's shifted ``[B, T]`` grid: column t is the response token the position t predicts,
its value V(s_t) the critic's output at that same position (the state before the token is sampled).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grpo_core.algo.losses import AggMode, aggregate_loss
from grpo_core.algo.masked import check_same_shape, masked_mean, masked_sum

# A variance of returns below this is float rounding of equal returns, not a spread (explained_variance).
_NO_SPREAD = 1e-10


def outcome_token_rewards(rewards: Tensor, mask: Tensor, token_penalty: Tensor | None = None) -> tuple[Tensor, dict]:
    """Each row's reward on its last response token, 0 elsewhere; minus ``token_penalty`` on every response token
    (the KL to the reference, when it is in the reward: verl's ``apply_kl_penalty``).

    rewards:       [B] one scalar per sampled answer (the shaped reward of the score stage).
    mask:          [B, T] 1 where the column is a response token the policy sampled (multi-turn: its own turns).
    token_penalty: [B, T] or None, subtracted where ``mask`` is 1.

    Returns ([B, T] token rewards, metrics). A row without a response token gets no reward at all."""
    if rewards.dim() != 1 or mask.dim() != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards must be [B] and mask [B, T] with the same B, got {tuple(rewards.shape)} and "
                         f"{tuple(mask.shape)}")
    m = mask.to(torch.bool)
    has = m.any(dim=1)
    last = (m.shape[1] - 1 - m.flip(1).to(torch.int8).argmax(dim=1))  # the last 1 of each row
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(has).squeeze(1)
    out[rows, last[rows]] = rewards[rows]
    metrics = {}
    if token_penalty is not None:
        check_same_shape(mask=mask, token_penalty=token_penalty)
        out = out - torch.where(m, token_penalty.to(out.dtype), torch.zeros((), dtype=out.dtype))
        metrics["kl_reward_penalty_mean"] = float(masked_sum(token_penalty, m) / has.sum().clamp(min=1))
    return out, metrics


def gae_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
                   lam: float = 1.0) -> tuple[Tensor, Tensor, dict[str, float]]:
    """Generalized Advantage Estimation (Schulman et al. 2016) over each row, from its end back.

    token_rewards: [B, T] (``outcome_token_rewards``).
    values:        [B, T] V(s_t) of the critic before the update (detached).
    mask:          [B, T] 1 on the policy's tokens. Columns with 0 inside a row (a multi-turn episode's tool output)
                   are skipped: the TD error steps from one policy token to the next, as verl's loop does.
    gamma, lam:    the discount and GAE's lambda, each in [0, 1]. gamma = lam = 1 (verl's default): the advantage
                   is the answer's return minus V(s_t).

    Returns (advantages [B, T] not whitened, returns [B, T] = advantages + values, metrics); both 0 off the mask."""
    check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    m = mask.to(token_rewards.dtype)
    values = values.to(token_rewards.dtype) * m
    next_value = torch.zeros_like(token_rewards[:, 0])
    running = torch.zeros_like(next_value)
    out = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        running = step * m[:, t] + (1 - m[:, t]) * running
        out[:, t] = running
    advantages = out * m
    returns = (advantages + values) * m
    return advantages, returns, {"returns_mean": float(masked_mean(returns, m)),
                                 "values_mean": float(masked_mean(values, m))}


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``values`` minus their mean over ``mask``, divided by their unbiased std over it (verl's ``masked_whiten``:
    PPO's advantage normalisation over the whole batch); 0 off the mask. Needs at least two masked entries."""
    check_same_shape(values=values, mask=mask)
    m = mask.to(values.dtype)
    n = m.sum()
    if n < 2:
        raise ValueError(f"whitening needs at least 2 masked entries, got {int(n)}")
    mean = masked_sum(values, m) / (n + eps)
    var = masked_sum((values - mean) ** 2, m) / (n + eps) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + eps) * m


def value_loss(vpreds: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None,
               agg_mode: AggMode = "token_mean", denominator: float | None = None,
               norm_length: int | None = None) -> tuple[Tensor, dict[str, float]]:
    """The clipped value loss: 0.5 x agg(max((V - R)^2, (clip(V, V_old +- clip) - R)^2)).

    vpreds:     [B, T] V_theta(s_t) with gradient.
    old_values: [B, T] the values the returns were computed with (before this update).
    returns:    [B, T] GAE's returns (the regression target).
    clip:       how far a prediction may move from ``old_values`` before the clipped term takes over; None: no
                clipping (plain squared error).
    agg_mode, denominator, norm_length: as ``aggregate_loss`` (``denominator`` over the whole mini-batch).

    Metrics: ``value_loss``, ``value_clipfrac`` (entries where the clipped term is the larger), ``vpred_mean``."""
    check_same_shape(vpreds=vpreds, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    unclipped = (vpreds - returns) ** 2
    if clip is None:
        losses, clipped_frac = unclipped, 0.0
    else:
        vclipped = old_values + (vpreds - old_values).clamp(-clip, clip)
        clipped = (vclipped - returns) ** 2
        losses = torch.maximum(unclipped, clipped)
        clipped_frac = float(masked_mean((clipped > unclipped).float(), mask))
    loss = 0.5 * aggregate_loss(losses, mask, agg_mode, norm_length=norm_length, global_denominator=denominator)
    return loss, {"value_loss": float(loss.detach()), "value_clipfrac": clipped_frac,
                  "vpred_mean": float(masked_mean(vpreds.detach(), mask))}


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over ``mask``: 1 when the critic predicts every return, 0 when it
    does no better than their mean, negative when worse. NaN when the returns do not vary (every answer scored
    alike): their variance is then float rounding (about 1e-16), and the ratio says nothing."""
    check_same_shape(values=values, returns=returns, mask=mask)
    m = mask.to(torch.float64)
    r, v = returns.to(torch.float64), values.to(torch.float64)
    var_r = masked_mean((r - masked_mean(r, m)) ** 2, m)
    diff = r - v
    var_d = masked_mean((diff - masked_mean(diff, m)) ** 2, m)
    return float(1.0 - var_d / var_r) if float(var_r) > _NO_SPREAD else float("nan")
