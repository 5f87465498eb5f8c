"""Off-policy corrections (grpo_core.algo.offpolicy): every kind against hand-computed weights and metrics, and
truncated_is_weights and sampler_mismatch against a per-token loop."""
import math

import pytest
import torch

from grpo_core.algo import offpolicy_weights, sampler_mismatch, truncated_is_weights

F64 = torch.float64


def test_hand_computed():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]], dtype=F64))
    samp = torch.log(torch.tensor([[0.25, 0.9, 0.8]], dtype=F64))
    w, m = truncated_is_weights(old, samp, torch.ones(1, 3), cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.25]], dtype=F64))  # 2.0 capped to 1.5
    assert m["offpolicy_capped_frac"] == pytest.approx(1 / 3)
    assert m["mismatch_abs_logp_mean"] == pytest.approx((math.log(2) + 0 + math.log(4)) / 3)


def test_decoupled_mode_masks_tokens_beyond_the_cap_and_keeps_the_others_whole():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.6]], dtype=F64))
    samp = torch.log(torch.tensor([[0.25, 0.9, 0.8, 0.4]], dtype=F64))
    w, m = truncated_is_weights(old, samp, torch.tensor([[1, 1, 1, 0]]), cap=1.5, mode="mask")
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.25, 0.0]], dtype=F64))  # 2.0 > cap: no loss; padding 0
    assert m["offpolicy_capped_frac"] == pytest.approx(1 / 3)
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
    assert m["offpolicy_capped_frac"] == pytest.approx(capped / n)


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


# Two rows: ratios pi_old / pi_sampler of [2, 1, 0.25] (product 0.5, geometric mean 0.794) and [1.5, 1] + one
# padding token (product 1.5, geometric mean 1.225).
OLD = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.6, 0.3, 0.7]], dtype=F64))
SAMP = torch.log(torch.tensor([[0.25, 0.9, 0.8], [0.4, 0.3, 0.01]], dtype=F64))
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _w(kind, **kw):
    return offpolicy_weights(OLD, SAMP, MASK, kind, **kw)


def _rows(*rows):
    return torch.tensor(rows, dtype=F64)


def test_seq_tis_weights_every_token_of_a_row_by_its_capped_product():
    w, m = _w("seq_tis", cap=2.0)
    assert torch.allclose(w, _rows([0.5, 0.5, 0.5], [1.5, 1.5, 0.0]))
    assert m["offpolicy_capped_frac"] == 0.0 and m["offpolicy_masked_frac"] == 0.0
    w, m = _w("seq_tis", cap=1.2)
    assert torch.allclose(w, _rows([0.5, 0.5, 0.5], [1.2, 1.2, 0.0]))
    assert m["offpolicy_capped_frac"] == pytest.approx(2 / 5)
    assert m["offpolicy_weight_mean"] == pytest.approx((1.5 + 2.4) / 5)
    assert m["offpolicy_weight_max"] == pytest.approx(1.2)


def test_icepop_keeps_token_ratios_inside_the_band_and_masks_the_rest():
    w, m = _w("icepop", band=(0.5, 2.0))  # 2.0 is inside (closed band), 0.25 is not
    assert torch.allclose(w, _rows([2.0, 1.0, 0.0], [1.5, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(1 / 5)
    w, m = _w("icepop", band=(0.5, 1.4))
    assert torch.allclose(w, _rows([0.0, 1.0, 0.0], [0.0, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(3 / 5)


def test_seq_mis_keeps_a_row_with_its_product_inside_the_band_and_drops_it_whole_outside():
    w, _ = _w("seq_mis", band=(0.5, 2.0))
    assert torch.allclose(w, _rows([0.5, 0.5, 0.5], [1.5, 1.5, 0.0]))
    w, m = _w("seq_mis", band=(0.6, 2.0))  # row 0's product 0.5 leaves the band
    assert torch.allclose(w, _rows([0.0, 0.0, 0.0], [1.5, 1.5, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(3 / 5)


def test_geo_mask_rejects_rows_by_the_geometric_mean_and_does_not_reweight():
    w, m = _w("geo_mask", band=(0.8, 1.25))  # geometric means 0.7937 (out) and 1.2247 (in)
    assert torch.allclose(w, _rows([0.0, 0.0, 0.0], [1.0, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(3 / 5)
    w, m = _w("geo_mask", band=(0.75, 1.25))
    assert torch.allclose(w, _rows([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == 0.0 and m["offpolicy_weight_mean"] == 1.0


def test_neg_adv_mask_drops_only_negative_advantage_rows_far_from_the_sampler():
    # mean log(pi_sampler / pi_old): row 0 (ln 0.5 + ln 4) / 3 = 0.2310, row 1 -ln(1.5) / 2 = -0.2027
    w, m = _w("neg_adv_mask", advantages=torch.tensor([-1.0, -1.0], dtype=F64), kl_threshold=0.1)
    assert torch.allclose(w, _rows([0.0, 0.0, 0.0], [1.0, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(3 / 5)
    w, _ = _w("neg_adv_mask", advantages=torch.tensor([1.0, -1.0], dtype=F64), kl_threshold=0.1)  # positive: kept
    assert torch.allclose(w, _rows([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]))
    w, _ = _w("neg_adv_mask", advantages=torch.tensor([-1.0, -1.0], dtype=F64), kl_threshold=0.25)
    assert torch.allclose(w, _rows([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]))


def test_tis_decoupled_and_none_through_the_one_entry_point():
    w, m = _w("tis", cap=1.5)
    assert torch.allclose(w, _rows([1.5, 1.0, 0.25], [1.5, 1.0, 0.0]))
    assert m["offpolicy_capped_frac"] == pytest.approx(1 / 5) and m["offpolicy_masked_frac"] == 0.0
    w, m = _w("decoupled", cap=1.5)  # ratio 2 is beyond the cap: masked; 1.5 is not
    assert torch.allclose(w, _rows([0.0, 1.0, 0.25], [1.5, 1.0, 0.0]))
    assert m["offpolicy_masked_frac"] == pytest.approx(1 / 5)
    w, m = _w("none")
    assert w is None and m == sampler_mismatch(OLD, SAMP, MASK)
    for kind in ("seq_tis", "icepop", "seq_mis", "geo_mask"):  # every kind reports the mismatch metrics too
        assert {k: _w(kind)[1][k] for k in m} == pytest.approx(m)


def test_offpolicy_errors_name_the_argument():
    with pytest.raises(ValueError, match="kind must be one of"):
        _w("clip")
    with pytest.raises(ValueError, match="band must satisfy"):
        _w("icepop", band=(1.2, 2.0))
    with pytest.raises(ValueError, match="neg_adv_mask needs advantages"):
        _w("neg_adv_mask")
    with pytest.raises(ValueError, match="sampler_logprobs"):
        offpolicy_weights(OLD, SAMP[:1], MASK, "seq_tis")
