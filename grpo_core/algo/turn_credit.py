"""Turn-level credit for multi-turn episodes: GiGPO's step-level groups (Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training", as verl-agent and Trinity-RFT implement it), as pure tensor functions.

Why: the trajectory-level default gives every turn of an episode its episode's advantage, so a good tool call in an
episode that later answered wrong is pushed down with it. GiGPO keeps that episode-level advantage and adds a
step-level one: within the G episodes of one prompt, the turns taken from the same state (the same tokens so far:
the same prompt, the same earlier calls and the same tool outputs) form a step group, and a turn's step advantage
compares its discounted return with the others' from that state. A turn alone in its state gets no step advantage.
No critic, no extra rollout: only the group's own episodes.
"""
from __future__ import annotations

import torch
from torch import Tensor


def turn_returns(rewards: Tensor, turns: Tensor, gamma: float) -> Tensor:
    """Each turn's discounted return from an outcome reward: R x gamma^(turns after it).

    rewards: [N] each episode's reward (given at its last turn).
    turns:   [N] long, the episode's assistant turns (n_i >= 0).
    gamma:   discount per turn, in [0, 1].

    Returns [N, K] with K = max n_i; entries past an episode's last turn are 0."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    k = int(turns.max()) if turns.numel() else 0
    idx = torch.arange(k)[None, :]
    after = (turns[:, None] - 1 - idx).clamp(min=0).to(rewards.dtype)
    return torch.where(idx < turns[:, None], rewards[:, None] * gamma ** after, torch.zeros((), dtype=rewards.dtype))


def step_group_advantages(state_ids: Tensor, returns: Tensor, group_size: int, scale: bool = True,
                          eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """GiGPO's step-level advantages.

    state_ids: [N, K] long, an id per (episode, turn) naming the state the turn was taken from (equal ids: equal
               states), -1 where the episode has no such turn. Rows are in groups of ``group_size`` episodes of one
               prompt; states are compared within a group only.
    returns:   [N, K] each turn's return (``turn_returns``).
    scale:     divide by the step group's unbiased std + eps (GiGPO's default), else only centre.

    Returns ([N, K] advantages: return minus its step group's mean, 0 for a turn alone in its state or past the
    episode's end; metrics: ``step_group_size_mean`` over turns, ``step_grouped_frac`` the share of turns whose
    state another episode of the group shares)."""
    if state_ids.shape != returns.shape or state_ids.dim() != 2:
        raise ValueError(f"state_ids and returns must be the same [N, K], got {tuple(state_ids.shape)} and "
                         f"{tuple(returns.shape)}")
    n, _ = state_ids.shape
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} episodes do not form groups of {group_size}")
    out = torch.zeros_like(returns)
    sizes: list[int] = []
    for start in range(0, n, group_size):
        ids, ret = state_ids[start:start + group_size], returns[start:start + group_size]
        for state in ids[ids >= 0].unique():
            at = ids == state
            members = ret[at]
            sizes += [members.numel()] * members.numel()
            if members.numel() < 2:
                continue
            centred = members - members.mean()
            out[start:start + group_size][at] = centred / (members.std() + eps) if scale else centred
    turns = len(sizes)
    return out, {"step_group_size_mean": sum(sizes) / turns if turns else 0.0,
                 "step_grouped_frac": sum(s > 1 for s in sizes) / turns if turns else 0.0}
