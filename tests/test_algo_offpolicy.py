"""truncated_is_weights and sampler_mismatch: weights, cap, masking and mismatch metrics against a per-token loop."""
import math

import pytest
import torch

from grpo_core.algo import sampler_mismatch, truncated_is_weights

F64 = torch.float64


def test_hand_computed():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]], dtype=F64))
    samp = torch.log(torch.tensor([[0.25, 0.9, 0.8]], dtype=F64))
    w, m = truncated_is_weights(old, samp, torch.ones(1, 3), cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.25]], dtype=F64))  # 2.0 capped to 1.5
    assert m["tis_capped_frac"] == pytest.approx(1 / 3)
    assert m["mismatch_abs_logp_mean"] == pytest.approx((math.log(2) + 0 + math.log(4)) / 3)


def test_decoupled_mode_masks_tokens_beyond_the_cap_and_keeps_the_others_whole():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.6]], dtype=F64))
    samp = torch.log(torch.tensor([[0.25, 0.9, 0.8, 0.4]], dtype=F64))
    w, m = truncated_is_weights(old, samp, torch.tensor([[1, 1, 1, 0]]), cap=1.5, mode="mask")
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.25, 0.0]], dtype=F64))  # 2.0 > cap: no loss; padding 0
    assert m["tis_capped_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="mode must be"):
        truncated_is_weights(old, samp, torch.ones(1, 4), cap=1.5, mode="clip")


def test_matches_loop_and_is_detached():
    gen = torch.Generator().manual_seed(0)
    old = (-torch.rand(5, 7, generator=gen, dtype=F64) * 3).requires_grad_(True)
    samp = old.detach() + torch.randn(5, 7, generator=gen, dtype=F64) * 0.5
    mask = torch.rand(5, 7, generator=gen) > 0.3
    samp[~mask] = -float("inf")  # padding garbage must not leak
    w, m = truncated_is_weights(old, samp, mask, cap=2.0)
    assert not w.requires_grad
    absd, k3, capped, n = 0.0, 0.0, 0, 0
    for i in range(5):
        for j in range(7):
            if not mask[i, j]:
                assert w[i, j].item() == 0.0
                continue
            d = old[i, j].item() - samp[i, j].item()
            assert abs(w[i, j].item() - min(math.exp(d), 2.0)) < 1e-9
            absd += abs(d)
            k3 += math.exp(d) - d - 1
            capped += math.exp(d) > 2.0
            n += 1
    assert m["mismatch_abs_logp_mean"] == pytest.approx(absd / n)
    assert m["mismatch_k3"] == pytest.approx(k3 / n)
    assert m["tis_capped_frac"] == pytest.approx(capped / n)


def test_errors():
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cap=0.0)
    with pytest.raises(ValueError, match="sampler_logprobs"):
        truncated_is_weights(torch.zeros(1, 2), torch.zeros(2, 2), torch.ones(1, 2), cap=2.0)


def test_sampler_mismatch_mean_max_and_k3_over_the_masked_tokens():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.1]], dtype=F64))
    samp = torch.log(torch.tensor([[0.25, 0.9, 0.8, 0.9]], dtype=F64))
    m = sampler_mismatch(old, samp, torch.tensor([[1, 1, 1, 0]]))  # the last token (|d| = log 9) is padding
    assert m["mismatch_abs_logp_mean"] == pytest.approx((math.log(2) + 0 + math.log(4)) / 3)
    assert m["mismatch_abs_logp_max"] == pytest.approx(math.log(4))
    assert m["mismatch_k3"] == pytest.approx(sum(math.exp(d) - d - 1 for d in (math.log(2), 0.0, -math.log(4))) / 3)
    _, tis = truncated_is_weights(old, samp, torch.tensor([[1, 1, 1, 0]]), cap=2.0)
    assert {k: tis[k] for k in m} == m  # TIS reports the same mismatch metrics
