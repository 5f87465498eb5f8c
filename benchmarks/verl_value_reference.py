"""verl's PPO critic functions on fixed tensors, saved for ``tests/test_algo_value.py`` (verl is not a dependency of
the project; this runs where it is importable):

    uv pip install --target /tmp/verl --no-deps verl==0.9.1 tensordict==0.10.0 omegaconf \\
        antlr4-python3-runtime==4.9.3 hydra-core codetiming pyvers importlib_metadata cloudpickle orjson
    PYTHONPATH=/tmp/verl .venv/bin/python benchmarks/verl_value_reference.py tests/data/verl_value_reference.pt

What it saves per case: the inputs, verl's ``compute_gae_advantage_return`` (advantages whitened by
``masked_whiten`` inside it, and returns), and ``compute_value_loss`` (loss, clip fraction, and the gradient of the
loss with respect to the predicted values).
"""
from __future__ import annotations

import sys

import torch
from verl import __version__ as verl_version
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_value_loss


def _mask(lengths: list[int], width: int, holes: list[tuple[int, int, int]] = ()) -> torch.Tensor:
    """Right-padded response masks; ``holes`` (row, start, end) zero a span inside a row (a tool's output)."""
    mask = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    for row, start, end in holes:
        mask[row, start:end] = 0
    return mask


def cases() -> list[dict]:
    gen = torch.Generator().manual_seed(20261129)
    out = []
    shapes = [([12, 7, 3, 12, 1, 9], [], 1.0, 1.0, 0.5),
              ([10, 10, 4, 8], [], 0.99, 0.95, 0.2),
              ([16, 14, 16, 11, 5], [(0, 3, 7), (2, 5, 6), (3, 2, 9)], 1.0, 0.95, 0.5),
              ([6, 6, 6, 6, 6, 6, 6, 6], [], 0.9, 0.0, 10.0)]
    for lengths, holes, gamma, lam, clip in shapes:
        width = max(lengths) + 2
        mask = _mask(lengths, width, holes)
        rewards = torch.randn(len(lengths), width, generator=gen) * 0.1 * mask
        last = [max(j for j in range(width) if mask[i, j] > 0) for i in range(len(lengths))]
        for i, j in enumerate(last):
            rewards[i, j] += float(torch.randint(0, 2, (1,), generator=gen))
        values = torch.randn(len(lengths), width, generator=gen) * 0.5
        vpreds = (values + torch.randn(len(lengths), width, generator=gen) * 0.4).requires_grad_(True)
        adv, ret = compute_gae_advantage_return(rewards, values, mask, torch.tensor(gamma), torch.tensor(lam))
        loss, clipfrac = compute_value_loss(vpreds, ret, values, mask, cliprange_value=clip,
                                            loss_agg_mode="token-mean")
        loss.backward()
        out.append({"token_rewards": rewards, "values": values, "mask": mask, "gamma": gamma, "lam": lam,
                    "clip": clip, "vpreds": vpreds.detach().clone(), "advantages_whitened": adv, "returns": ret,
                    "value_loss": loss.detach(), "value_clipfrac": float(clipfrac), "vpreds_grad": vpreds.grad})
    return out


if __name__ == "__main__":
    torch.save({"verl": verl_version, "cases": cases()}, sys.argv[1])
    print(f"saved {sys.argv[1]} (verl {verl_version})")
