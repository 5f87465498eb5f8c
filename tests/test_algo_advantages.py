"""compute_advantages: hand-computed values and a per-sample python loop on random rewards."""
import math
import statistics

import pytest
import torch

from grpo_core.algo import compute_advantages


def _loop(rewards, estimator, scale, eps):
    rows = rewards.tolist()
    flat = [x for row in rows for x in row]
    batch_std = statistics.stdev(flat)
    out = []
    for row in rows:
        g = len(row)
        mean = sum(row) / g
        std = statistics.stdev(row)
        adv_row = []
        for i, r in enumerate(row):
            base = (sum(row) - r) / (g - 1) if estimator == "rloo" else mean
            a = r - base
            if scale == "group_std":
                a /= std + eps
            elif scale == "batch_std":
                a /= batch_std + eps
            adv_row.append(a)
        out.append(adv_row)
    return torch.tensor(out, dtype=torch.float64)


def test_grpo_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    adv, m = compute_advantages(r, "grpo", eps=0.0)
    std = math.sqrt(1 / 3)  # unbiased: sum of squares 4 * 0.25 = 1, divided by 3
    assert torch.allclose(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5]], dtype=torch.float64) / std)
    assert m["zero_std_group_frac"] == 0.0


def test_dr_grpo_and_rloo_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv, _ = compute_advantages(r, "dr_grpo")
    assert torch.allclose(adv, torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))
    adv, _ = compute_advantages(r, "rloo")
    assert torch.allclose(adv, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64))


def test_equal_rewards_give_zero_not_nan():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv, m = compute_advantages(r, "grpo")
    assert torch.all(adv[0] == 0) and torch.isfinite(adv).all()
    assert m["zero_std_group_frac"] == 0.5


@pytest.mark.parametrize("estimator,scale", [("grpo", "group_std"), ("grpo", "batch_std"), ("grpo", "none"),
                                             ("dr_grpo", "none"), ("rloo", "none"), ("rloo", "group_std"),
                                             ("rloo", "batch_std")])
def test_matches_loop(estimator, scale):
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(7, 5, generator=gen, dtype=torch.float64)
    adv, _ = compute_advantages(r, estimator, scale, eps=1e-6)
    assert torch.allclose(adv, _loop(r, estimator, scale, 1e-6), atol=1e-6, rtol=0)


def test_default_scale_follows_estimator():
    r = torch.rand(3, 4, dtype=torch.float64)
    assert torch.equal(compute_advantages(r, "grpo")[0], compute_advantages(r, "grpo", "group_std")[0])
    assert torch.equal(compute_advantages(r, "rloo")[0], compute_advantages(r, "rloo", "none")[0])


@pytest.mark.parametrize("kwargs,match", [
    ({"estimator": "ppo"}, "estimator"), ({"scale": "max"}, "scale"),
    ({"estimator": "dr_grpo", "scale": "group_std"}, "dr_grpo"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(torch.rand(2, 3), **kwargs)


def test_bad_rewards():
    with pytest.raises(ValueError, match="G >= 2"):
        compute_advantages(torch.rand(4, 1))
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        compute_advantages(torch.rand(4))
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([[1.0, float("nan")]]))
