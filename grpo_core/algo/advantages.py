"""Group-relative advantages: one scalar per sampled answer, computed from the rewards of its group.

GRPO-family methods need no value network: the G answers sampled for the same prompt form the baseline. The
estimator picks the baseline (the group mean, or the mean of the other G-1 answers) and `scale` picks what the
centred reward is divided by. Standard deviations are the UNBIASED sample std (`torch.std`, divisor n-1), as in
verl (`torch.std` per group) and TRL (`rewards.view(-1, G).std(dim=1)`, and `rewards.std()` for batch scaling).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Estimator = Literal["grpo", "dr_grpo", "rloo"]
Scale = Literal["group_std", "batch_std", "none"]

ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")
SCALES: tuple[str, ...] = ("group_std", "batch_std", "none")
DEFAULT_SCALE: dict[str, str] = {"grpo": "group_std", "dr_grpo": "none", "rloo": "none"}


def compute_advantages(rewards: Tensor, estimator: Estimator = "grpo", scale: Scale | None = None,
                       eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """Advantages for a batch of groups.

    rewards: [N, G] float, one row per prompt, one column per sampled answer (G >= 2).
    estimator:
      - "grpo":    A = (r - mean_group(r)) / (std + eps), std chosen by `scale` (default: the group's).
      - "dr_grpo": A = r - mean_group(r) (Dr.GRPO removes the std division; `scale` must be "none" or None).
      - "rloo":    A = r - mean of the OTHER G-1 rewards of the group (= G/(G-1) * (r - group mean)).
    scale: "group_std" (unbiased std of the row), "batch_std" (unbiased std of all N*G rewards), "none".
      None: the estimator's own default (grpo -> group_std, dr_grpo -> none, rloo -> none).
    eps: added to the std so a group whose rewards are all equal gets advantage 0, not NaN.

    Returns (advantages [N, G] in the dtype of `rewards`, metrics).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator={estimator!r} is unknown; choose one of {ESTIMATORS}")
    if scale is None:
        scale = DEFAULT_SCALE[estimator]  # type: ignore[assignment]
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is unknown; choose one of {SCALES} (or None for the estimator default)")
    if estimator == "dr_grpo" and scale != "none":
        raise ValueError(f"estimator='dr_grpo' divides by no std; got scale={scale!r}: use scale='none' "
                         "(or estimator='grpo' to scale)")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G] (one row per prompt), got shape {tuple(rewards.shape)}")
    n, g = rewards.shape
    if g < 2:
        raise ValueError(f"rewards has group size G={g}; group-relative advantages need G >= 2")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got dtype {rewards.dtype}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contains NaN or inf: score or drop those samples before computing advantages")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")

    mean = rewards.mean(dim=1, keepdim=True)
    if estimator == "rloo":
        baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    else:
        baseline = mean
    centred = rewards - baseline

    group_std = rewards.std(dim=1, keepdim=True)  # unbiased
    if scale == "group_std":
        adv = centred / (group_std + eps)
    elif scale == "batch_std":
        adv = centred / (rewards.std() + eps)
    else:
        adv = centred

    zero_std = group_std.squeeze(1) <= eps
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "adv_mean": float(adv.mean()),
        "adv_std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "adv_abs_max": float(adv.abs().max()),
        "zero_std_group_frac": float(zero_std.float().mean()),
    }
    return adv, metrics
