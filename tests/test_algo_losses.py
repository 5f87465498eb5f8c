"""policy_loss and aggregate_loss: hand-computed values, a per-token python loop, GSPO gradients, and the
micro-batch/mini-batch equivalence of `global_denominator`."""
import math

import pytest
import torch

from grpo_core.algo import AGG_MODES, aggregate_loss, loss_denominator, policy_loss

F64 = torch.float64


def _agg_loop(values, mask, mode, norm_length=None):
    v, m = values.tolist(), mask.tolist()
    seqs = [[x for x, k in zip(row, mrow) if k] for row, mrow in zip(v, m)]
    nonempty = [s for s in seqs if s]
    if mode == "token_mean":
        n = sum(len(s) for s in seqs)
        return sum(sum(s) for s in seqs) / max(n, 1)
    if mode == "seq_mean_token_mean":
        return sum(sum(s) / len(s) for s in nonempty) / max(len(nonempty), 1)
    if mode == "seq_mean_token_sum":
        return sum(sum(s) for s in nonempty) / max(len(nonempty), 1)
    return sum(sum(s) for s in nonempty) / (max(len(nonempty), 1) * norm_length)


def _random_batch(seed, b=6, t=9):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=F64) * 3
    old = logp + (torch.rand(b, t, generator=gen, dtype=F64) - 0.5) * 1.2
    adv = torch.randn(b, generator=gen, dtype=F64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    mask[0] = False  # one empty sequence
    return logp, old, adv, mask


def _loss_loop(logp, old, adv, mask, lo, hi, level, dual, skip, mode, norm, isw):
    b, t = logp.shape
    per = [[0.0] * t for _ in range(b)]
    stats = {"low": 0, "high": 0, "skip": 0, "dual": 0, "n": 0, "ratios": [], "k3": []}
    for i in range(b):
        toks = [j for j in range(t) if mask[i, j]]
        seq_ratio = math.exp(sum(logp[i, j].item() - old[i, j].item() for j in toks) / len(toks)) if toks else 1.0
        a = adv[i].item()
        for j in toks:
            lr = logp[i, j].item() - old[i, j].item()
            r = math.exp(lr) if level == "token" else seq_ratio
            loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
            if dual is not None and a < 0:
                loss = min(loss, -a * dual)
                stats["dual"] += r > dual
            if skip is not None and r > skip:
                loss = 0.0
                stats["skip"] += 1
            if isw is not None:
                loss *= isw[i, j].item()
            per[i][j] = loss
            stats["low"] += r < 1 - lo and a < 0
            stats["high"] += r > 1 + hi and a > 0
            stats["n"] += 1
            stats["ratios"].append(r)
            stats["k3"].append(math.exp(-lr) + lr - 1)
    value = _agg_loop(torch.tensor(per, dtype=F64), mask, mode, norm)
    return value, stats


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_loop(mode):
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(5, 7, generator=gen, dtype=F64)
    mask = torch.rand(5, 7, generator=gen) > 0.4
    mask[2] = False
    got = aggregate_loss(v, mask, mode, norm_length=11)
    assert abs(got.item() - _agg_loop(v, mask, mode, 11)) < 1e-6


def test_aggregate_hand_computed():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_loss(v, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(v, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(v, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(v, mask, "seq_mean_token_sum_norm", norm_length=5).item() == pytest.approx(10 / (2 * 5))
    assert aggregate_loss(v, torch.zeros_like(mask), "token_mean").item() == 0.0


def test_aggregate_errors():
    v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(v, torch.ones(2, 3), "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="mode"):
        aggregate_loss(v, torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(v, torch.ones(2, 4), "token_mean")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_sum_to_mini_batch(mode):
    logp, old, adv, mask = _random_batch(2, b=8)
    logp.requires_grad_(True)
    full, _ = policy_loss(logp, old, adv, mask, agg_mode=mode, norm_length=9, clip_eps_high=0.28)
    full.backward()
    grad_full = logp.grad.clone()
    logp.grad = None
    denom = loss_denominator(mask, mode)
    total = 0.0
    for sl in (slice(0, 3), slice(3, 5), slice(5, 8)):
        part, _ = policy_loss(logp[sl], old[sl], adv[sl], mask[sl], agg_mode=mode, norm_length=9,
                              clip_eps_high=0.28, global_denominator=denom)
        part.backward()
        total += part.item()
    assert abs(total - full.item()) < 1e-9
    assert torch.allclose(logp.grad, grad_full, atol=1e-12)


def test_policy_loss_hand_computed():
    # three single-token sequences: (ratio, A) = (1.5, +1), (0.5, -1), (5, -1)
    old = torch.zeros(3, 1, dtype=F64)
    logp = torch.log(torch.tensor([[1.5], [0.5], [5.0]], dtype=F64))
    adv = torch.tensor([1.0, -1.0, -1.0], dtype=F64)
    mask = torch.ones(3, 1, dtype=torch.bool)
    loss, m = policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, agg_mode="token_mean")
    # -1.28 (clipped high), max(0.5, 0.8) = 0.8 (clipped low), 5 (A<0, ratio above: unclipped)
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 5.0) / 3)
    assert m["clipfrac_high"] == pytest.approx(1 / 3) and m["clipfrac_low"] == pytest.approx(1 / 3)
    assert m["clipfrac"] == pytest.approx(2 / 3)
    assert m["ratio_max"] == pytest.approx(5.0) and m["ratio_mean"] == pytest.approx(7 / 3)
    loss, m = policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0)
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 3.0) / 3)
    assert m["dual_clip_frac"] == pytest.approx(1 / 3)
    loss, m = policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, skip_threshold=2.0)
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 0.0) / 3)  # skipped token stays in the denominator
    assert m["skipped_frac"] == pytest.approx(1 / 3)
    w = torch.tensor([[0.5], [2.0], [1.0]], dtype=F64)
    loss, _ = policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, is_weights=w)
    assert loss.item() == pytest.approx((-0.64 + 1.6 + 5.0) / 3)


def test_gradient_is_zero_when_clipped():
    old = torch.zeros(2, 1, dtype=F64)
    logp = torch.log(torch.tensor([[1.5], [1.1]], dtype=F64)).requires_grad_(True)
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, 1.0], dtype=F64), torch.ones(2, 1), agg_mode="token_mean")
    loss.backward()
    assert logp.grad[0, 0] == 0.0  # ratio 1.5 > 1.2 with A > 0: clipped
    assert logp.grad[1, 0].item() == pytest.approx(-1.1 / 2)  # d(-A r)/dlogp = -A r, over 2 tokens


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("extras", [{}, {"dual_clip": 2.0, "skip_threshold": 1.4, "weights": True}])
def test_policy_loss_matches_loop(level, mode, extras):
    logp, old, adv, mask = _random_batch(3)
    isw = torch.rand(logp.shape, dtype=F64, generator=torch.Generator().manual_seed(9)) * 2 if extras else None
    dual, skip = extras.get("dual_clip"), extras.get("skip_threshold")
    loss, m = policy_loss(logp, old, adv, mask, clip_eps_low=0.1, clip_eps_high=0.15, ratio_level=level,
                          dual_clip=dual, skip_threshold=skip, agg_mode=mode, norm_length=13, is_weights=isw)
    ref, st = _loss_loop(logp, old, adv, mask, 0.1, 0.15, level, dual, skip, mode, 13, isw)
    assert abs(loss.item() - ref) < 1e-6
    n = st["n"]
    assert m["clipfrac_low"] == pytest.approx(st["low"] / n, abs=1e-9)
    assert m["clipfrac_high"] == pytest.approx(st["high"] / n, abs=1e-9)
    assert m["skipped_frac"] == pytest.approx(st["skip"] / n, abs=1e-9)
    assert m["dual_clip_frac"] == pytest.approx(st["dual"] / n, abs=1e-9)
    assert m["ratio_mean"] == pytest.approx(sum(st["ratios"]) / n, abs=1e-6)
    assert m["ratio_max"] == pytest.approx(max(st["ratios"]), abs=1e-6)
    assert m["approx_kl"] == pytest.approx(sum(st["k3"]) / n, abs=1e-6)


def test_gspo_gradient_equals_sequence_objective():
    """GSPO-token with sequence advantages and seq_mean_token_mean has GSPO's gradient."""
    logp, old, adv, mask = _random_batch(4)
    mask[0, :2] = True
    lo, hi = 0.05, 0.06
    x = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(x, old, adv, mask, clip_eps_low=lo, clip_eps_high=hi, ratio_level="sequence",
                          agg_mode="seq_mean_token_mean")
    loss.backward()
    y = logp.clone().requires_grad_(True)
    mf = mask.to(F64)
    s = torch.exp(((y - old) * mf).sum(1) / mf.sum(1))
    ref = torch.maximum(-adv * s, -adv * s.clamp(1 - lo, 1 + hi)).mean()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-9
    assert torch.allclose(x.grad, y.grad * mf, atol=1e-12)


def test_policy_loss_argument_errors():
    logp, old, adv, mask = _random_batch(5)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, adv, mask, dual_clip=0.9)
    with pytest.raises(ValueError, match="skip_threshold"):
        policy_loss(logp, old, adv, mask, skip_threshold=1.0)
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(logp, old, adv, mask, ratio_level="chunk")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, adv[:-1], mask)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(logp, old[:, :-1], adv, mask)
    with pytest.raises(ValueError, match="clip_eps_low"):
        policy_loss(logp, old, adv, mask, clip_eps_low=1.0)


def test_extreme_ratios_stay_finite():
    logp = torch.tensor([[0.0, -200.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-200.0, 0.0]], dtype=F64)
    loss, m = policy_loss(logp, old, torch.tensor([-1.0], dtype=F64), torch.ones(1, 2))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all() and math.isfinite(m["approx_kl"])
