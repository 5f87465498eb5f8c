"""PPO's critic functions (grpo_core.algo.value) against verl's on saved tensors (tests/data/verl_value_reference.pt,
made by benchmarks/verl_value_reference.py with verl 0.9.1), and their own properties."""
import math
from pathlib import Path

import pytest
import torch

from grpo_core.algo.value import explained_variance, gae_advantages, outcome_token_rewards, value_loss, whiten

REFERENCE = torch.load(Path(__file__).parent / "data" / "verl_value_reference.pt")


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: f"gamma{c['gamma']}-lam{c['lam']}-clip{c['clip']}")
def test_gae_whitening_and_the_value_loss_equal_verls(case):
    mask = case["mask"]
    adv, ret, _ = gae_advantages(case["token_rewards"], case["values"], mask, case["gamma"], case["lam"])
    on = mask.bool()
    torch.testing.assert_close(ret[on], case["returns"][on], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(whiten(adv, mask)[on], case["advantages_whitened"][on], rtol=1e-5, atol=1e-5)
    vpreds = case["vpreds"].clone().requires_grad_(True)
    loss, metrics = value_loss(vpreds, case["values"], case["returns"], mask, clip=case["clip"],
                               denominator=float(mask.sum()))
    loss.backward()
    torch.testing.assert_close(loss.detach(), case["value_loss"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(vpreds.grad, case["vpreds_grad"], rtol=1e-6, atol=1e-8)
    assert metrics["value_clipfrac"] == pytest.approx(case["value_clipfrac"], abs=1e-6)


def test_the_reference_covers_clipping_holes_and_discounts():
    cases = REFERENCE["cases"]
    assert any(0 < c["value_clipfrac"] < 1 for c in cases)
    assert any(c["gamma"] < 1 and c["lam"] < 1 for c in cases)
    # a mask with a hole inside a row (a multi-turn episode's tool output)
    assert any(bool(((c["mask"][:, 1:] - c["mask"][:, :-1]) > 0).any()) for c in cases)


def test_outcome_rewards_sit_on_each_rows_last_policy_token():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], dtype=torch.float32)
    rewards, _ = outcome_token_rewards(torch.tensor([1.0, -2.0, 5.0, 0.5]), mask)
    assert rewards.tolist() == [[0, 0, 1, 0], [0, -2, 0, 0], [0, 0, 0, 0], [0, 0, 0.5, 0]]
    penalty = torch.full((4, 4), 0.25)
    shaped, m = outcome_token_rewards(torch.tensor([1.0, -2.0, 5.0, 0.5]), mask, penalty)
    assert shaped[0].tolist() == [-0.25, -0.25, 0.75, 0.0] and shaped[2].tolist() == [0, 0, 0, 0]
    assert m["kl_reward_penalty_mean"] == pytest.approx((3 + 1 + 2) * 0.25 / 3)


def test_with_gamma_and_lambda_one_the_advantage_is_the_return_minus_the_value():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, -0.5, 9.0, 9.0]])
    rewards, _ = outcome_token_rewards(torch.tensor([1.0, 0.0]), mask)
    adv, ret, _ = gae_advantages(rewards, values, mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]]))
    torch.testing.assert_close(adv, (ret - values) * mask)


def test_a_critic_that_is_right_gives_zero_advantage_and_explains_everything():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    rewards, _ = outcome_token_rewards(torch.tensor([1.0, 0.0]), mask)
    values = torch.tensor([[1.0, 1, 1, 0], [0, 0, 0, 0]])
    adv, ret, _ = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.9)
    assert float(adv.abs().max()) == 0.0
    assert explained_variance(values, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(values), ret, mask) == pytest.approx(0.0, abs=1e-12)  # no better
    assert explained_variance(ret + 1.0, ret, mask) == pytest.approx(1.0)  # a constant offset explains it all
    assert explained_variance(-ret, ret, mask) < 0  # worse than the mean


def test_explained_variance_is_nan_when_the_returns_do_not_vary():
    mask = torch.ones(2, 3)
    returns = torch.full((2, 3), 0.1) + torch.tensor([[0.0, 1e-9, 0.0], [0.0, 0.0, -1e-9]])  # rounding, no spread
    assert math.isnan(explained_variance(torch.randn(2, 3), returns, mask))


def test_the_value_loss_without_clipping_is_half_the_squared_error():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.float32)
    loss, m = value_loss(torch.tensor([[1.0, 2.0, 7.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 0.0]]), mask,
                         clip=None)
    assert float(loss) == pytest.approx(0.5 * (1 + 4) / 2) and m["value_clipfrac"] == 0.0


@pytest.mark.parametrize("bad", [dict(gamma=1.5), dict(lam=-0.1)])
def test_gae_refuses_a_discount_outside_0_1(bad):
    with pytest.raises(ValueError, match="gamma and lam"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), **bad)


def test_whitening_needs_two_entries_and_a_clip_must_be_positive():
    with pytest.raises(ValueError, match="at least 2"):
        whiten(torch.ones(1, 3), torch.tensor([[0.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="clip must be"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), clip=0.0)
