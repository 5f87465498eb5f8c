"""kl_penalty estimators and KL-in-reward, against hand values and a per-token loop."""
import math

import pytest
import torch

from grpo_core.algo import apply_kl_to_reward, kl_penalty

F64 = torch.float64


def test_hand_computed():
    logp = torch.tensor([[math.log(0.5)]], dtype=F64)
    ref = torch.tensor([[math.log(0.25)]], dtype=F64)
    d = math.log(2.0)
    assert kl_penalty(logp, ref, "k1")[0].item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2")[0].item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(logp, ref, "k3")[0].item() == pytest.approx(0.5 + d - 1)  # exp(-d) - (-d) - 1


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_matches_loop(est):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=gen, dtype=F64) * 4
    ref = -torch.rand(4, 6, generator=gen, dtype=F64) * 4
    mask = torch.rand(4, 6, generator=gen) > 0.3
    kl, m = kl_penalty(logp, ref, est, mask)
    vals = []
    for i in range(4):
        for j in range(6):
            d = logp[i, j].item() - ref[i, j].item()
            want = {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[est] if mask[i, j] else 0.0
            assert abs(kl[i, j].item() - want) < 1e-9
            if mask[i, j]:
                vals.append(want)
    assert m["kl_mean"] == pytest.approx(sum(vals) / len(vals))


def test_k3_gradient_flows_to_policy_only():
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=F64, requires_grad=True)
    kl, _ = kl_penalty(logp, ref, "k3")
    kl.sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    want = 1 - torch.exp(ref.detach() - logp.detach())
    assert torch.allclose(logp.grad, want) and ref.grad is None


def test_kl_in_reward():
    logp = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -2.0, 9.0], [-1.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    shaped, m = apply_kl_to_reward(torch.tensor([1.0, 0.0], dtype=F64), logp, ref, mask, coeff=0.1,
                                   estimator="k1")
    assert torch.allclose(shaped, torch.tensor([1.0 - 0.1 * 1.5, 0.0 + 0.1 * 1.0], dtype=F64))
    assert m["kl_seq_mean"] == pytest.approx((1.5 - 1.0) / 2)


def test_errors():
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="coeff"):
        apply_kl_to_reward(torch.zeros(1), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), -1.0)
