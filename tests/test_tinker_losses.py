"""Tinker's built-in losses: each value and its gradient w.r.t. target_logprobs against a per-token reference written
out here in plain Python (closed-form derivatives, no torch), clips active on both sides, and every refusal naming
its field."""
from __future__ import annotations

import math
import random

import pytest
import torch

from grpo_core.algo.tinker_losses import (SERVED_LOSSES, LossInputError, check_config, elementwise_loss,
                                          required_inputs)

F64 = torch.float64
LO, HI = 0.8, 1.2


def _data(seed: int, n: int = 40, spread: float = 0.7) -> dict[str, list[float]]:
    """t, s, A, w for n tokens; the first 4 are prompt positions (A = 0, s = 0, as the cookbook sends them)."""
    rng = random.Random(seed)
    t = [-rng.random() * 3 for _ in range(n)]
    s = [ti + rng.uniform(-spread, spread) for ti in t]
    adv = [rng.gauss(0, 1) for _ in range(n)]
    for i in range(4):
        s[i], adv[i] = 0.0, 0.0
    w = [rng.uniform(-2, 2) for _ in range(n)]
    return {"t": t, "s": s, "A": adv, "w": w}


def _run(loss_fn, t, inputs, config=None):
    """(per-token loss, d sum / d t, metrics) through the function under test, as lists."""
    tt = torch.tensor(t, dtype=F64, requires_grad=True)
    tensors = {k: torch.tensor(v, dtype=F64) for k, v in inputs.items()}
    per_token, metrics = elementwise_loss(loss_fn, tt, tensors, config)
    assert per_token.shape == tt.shape
    per_token.sum().backward()
    return per_token.detach().tolist(), tt.grad.tolist(), metrics


def _close(got, want, tol=1e-10):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert math.isclose(g, w, rel_tol=tol, abs_tol=tol), f"position {i}: got {g}, want {w}"


def _clip(r, lo, hi):
    return lo if r < lo else hi if r > hi else r


def _ppo_token(r, a, lo, hi):
    """(loss, d loss / d t) of one token: the clipped branch (r outside [lo, hi] and chosen by min) has no gradient."""
    unclipped, clipped = r * a, _clip(r, lo, hi) * a
    value = -min(unclipped, clipped)
    grad = -r * a if (lo <= r <= hi or unclipped < clipped) else 0.0
    return value, grad


# ---- values and gradients -------------------------------------------------------------------------------------------

def test_cross_entropy_with_negative_weights_and_without_weights():
    d = _data(1)
    assert min(d["w"]) < 0 < max(d["w"])
    loss, grad, metrics = _run("cross_entropy", d["t"], {"weights": d["w"]})
    _close(loss, [-ti * wi for ti, wi in zip(d["t"], d["w"])])
    _close(grad, [-wi for wi in d["w"]])
    assert metrics == {}
    loss, grad, _ = _run("cross_entropy", d["t"], {})
    _close(loss, [-ti for ti in d["t"]])
    _close(grad, [-1.0] * len(d["t"]))


def test_importance_sampling_value_gradient_and_weights():
    d = _data(2)
    r = [math.exp(ti - si) for ti, si in zip(d["t"], d["s"])]
    loss, grad, metrics = _run("importance_sampling", d["t"], {"logprobs": d["s"], "advantages": d["A"]})
    _close(loss, [-ri * ai for ri, ai in zip(r, d["A"])])
    _close(grad, [-ri * ai for ri, ai in zip(r, d["A"])])  # d/dt exp(t - s) = exp(t - s)
    assert metrics["active_tokens"] == len(d["t"]) - 4
    loss, grad, _ = _run("importance_sampling", d["t"], {"logprobs": d["s"], "advantages": d["A"], "weights": d["w"]})
    _close(loss, [-ri * ai * wi for ri, ai, wi in zip(r, d["A"], d["w"])])
    _close(grad, [-ri * ai * wi for ri, ai, wi in zip(r, d["A"], d["w"])])


def test_ppo_value_gradient_and_clip_fractions_with_both_sides_active():
    d = _data(3)
    r = [math.exp(ti - si) for ti, si in zip(d["t"], d["s"])]
    cases = list(zip(r, d["A"]))
    # every branch occurs: clipped below (A<0) and above (A>0), unclipped although out of bounds, inside
    assert any(a < 0 and ri < LO for ri, a in cases) and any(a > 0 and ri > HI for ri, a in cases)
    assert any(a > 0 and ri < LO for ri, a in cases) and any(a < 0 and ri > HI for ri, a in cases)
    assert any(LO <= ri <= HI and a != 0 for ri, a in cases)
    ref = [_ppo_token(ri, a, LO, HI) for ri, a in cases]
    loss, grad, metrics = _run("ppo", d["t"], {"logprobs": d["s"], "advantages": d["A"]})
    _close(loss, [v for v, _ in ref])
    _close(grad, [g for _, g in ref])
    assert any(g == 0.0 for g, (_, a) in zip(grad, cases) if a != 0)
    active = [a != 0 for _, a in cases]
    n = sum(active)
    assert metrics["clip_low_frac"] == pytest.approx(sum(a < 0 and ri < LO for ri, a in cases) / n)
    assert metrics["clip_high_frac"] == pytest.approx(sum(a > 0 and ri > HI for ri, a in cases) / n)
    assert metrics["clip_low_frac"] > 0 and metrics["clip_high_frac"] > 0


def test_ppo_config_bounds_and_per_token_bounds_override_the_config():
    d = _data(4)
    r = [math.exp(ti - si) for ti, si in zip(d["t"], d["s"])]
    inputs = {"logprobs": d["s"], "advantages": d["A"]}
    loss, grad, _ = _run("ppo", d["t"], inputs, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    ref = [_ppo_token(ri, a, 0.9, 1.1) for ri, a in zip(r, d["A"])]
    _close(loss, [v for v, _ in ref])
    _close(grad, [g for _, g in ref])
    rng = random.Random(44)
    lows = [rng.uniform(0.5, 1.0) for _ in r]
    highs = [rng.uniform(1.0, 1.5) for _ in r]
    loss, grad, _ = _run("ppo", d["t"], inputs | {"clip_low_threshold": lows, "clip_high_threshold": highs},
                         {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    ref = [_ppo_token(ri, a, lo, hi) for ri, a, lo, hi in zip(r, d["A"], lows, highs)]
    _close(loss, [v for v, _ in ref])
    _close(grad, [g for _, g in ref])


def test_cispo_gradient_treats_the_clipped_ratio_as_a_constant():
    d = _data(5)
    r = [math.exp(ti - si) for ti, si in zip(d["t"], d["s"])]
    assert any(ri < LO for ri in r[4:]) and any(ri > HI for ri in r[4:])
    rc = [_clip(ri, LO, HI) for ri in r]
    loss, grad, metrics = _run("cispo", d["t"], {"logprobs": d["s"], "advantages": d["A"]})
    _close(loss, [-c * ti * a for c, ti, a in zip(rc, d["t"], d["A"])])
    _close(grad, [-c * a for c, a in zip(rc, d["A"])])  # not -(c + t dc/dt) A: no gradient through the ratio
    n = sum(a != 0 for a in d["A"])
    assert metrics["clip_low_frac"] == pytest.approx(sum(ri < LO and a != 0 for ri, a in zip(r, d["A"])) / n)
    assert metrics["clip_high_frac"] == pytest.approx(sum(ri > HI and a != 0 for ri, a in zip(r, d["A"])) / n)


def test_dro_value_and_gradient():
    d = _data(6)
    beta = 0.3
    loss, grad, _ = _run("dro", d["t"], {"logprobs": d["s"], "advantages": d["A"]}, {"beta": beta})
    _close(loss, [-(ti * a - 0.5 * beta * (ti - si) ** 2) for ti, si, a in zip(d["t"], d["s"], d["A"])])
    _close(grad, [-(a - beta * (ti - si)) for ti, si, a in zip(d["t"], d["s"], d["A"])])


def _gspo_reference(t, s, adv, mask, lo, hi):
    """Per-token (loss, gradient): every token takes the sequence ratio's value and its own token's gradient."""
    marked = [ti - si for ti, si, m in zip(t, s, mask) if m != 0]
    seq_ratio = math.exp(sum(marked) / len(marked))
    return seq_ratio, [_ppo_token(seq_ratio, a, lo, hi) for a in adv]


@pytest.mark.parametrize("shift", [0.5, -0.5, 0.0])  # sequence ratio above hi, below lo, inside
def test_gspo_value_and_gradient_use_the_masked_sequence_ratio(shift):
    d = _data(7, n=16, spread=0.3)
    s = [si - shift for si in d["s"]]
    mask = [0.0] * 4 + [1.0] * 12
    mask[9] = 0.0  # a response token left out of the ratio, with a nonzero advantage
    s[9] += 5.0  # far off: would move the ratio if it were counted
    assert d["A"][9] != 0
    seq_ratio, ref = _gspo_reference(d["t"], s, d["A"], mask, LO, HI)
    assert (seq_ratio > HI) if shift > 0 else (seq_ratio < LO) if shift < 0 else (LO <= seq_ratio <= HI)
    loss, grad, metrics = _run("gspo", d["t"], {"logprobs": s, "advantages": d["A"], "sequence_ratio_mask": mask})
    _close(loss, [v for v, _ in ref])
    _close(grad, [g for _, g in ref])
    assert metrics["sequence_ratio"] == pytest.approx(seq_ratio)
    assert metrics["ratio_tokens"] == 11
    if shift != 0:
        assert any(g == 0.0 for g, a in zip(grad, d["A"]) if a != 0)  # clipped tokens
        assert any(g != 0.0 for g in grad)  # tokens whose advantage sign keeps the unclipped branch


def test_the_loss_sum_is_tinkers_sum_without_normalisation():
    d = _data(8)
    loss, _, _ = _run("importance_sampling", d["t"], {"logprobs": d["s"], "advantages": d["A"]})
    assert sum(loss) == pytest.approx(-sum(math.exp(ti - si) * a for ti, si, a in zip(d["t"], d["s"], d["A"])))


# ---- inputs and config ----------------------------------------------------------------------------------------------

def test_required_inputs_list_target_tokens_but_the_function_does_not_need_it():
    assert required_inputs("cross_entropy") == ("target_tokens",)
    for loss_fn in ("importance_sampling", "ppo", "cispo", "dro"):
        assert required_inputs(loss_fn) == ("target_tokens", "logprobs", "advantages")
    assert required_inputs("gspo") == ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask")
    assert set(SERVED_LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"}
    _run("ppo", [-1.0, -2.0], {"logprobs": [-1.1, -1.9], "advantages": [1.0, -1.0]})  # no target_tokens given


def test_check_config_fills_defaults():
    assert check_config("ppo", {}) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert check_config("gspo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert check_config("cispo", {"clip_high_threshold": 2}) == {"clip_low_threshold": 0.8, "clip_high_threshold": 2.0}
    assert check_config("dro", {"beta": 0.05}) == {"beta": 0.05}
    assert check_config("cross_entropy", {}) == {} and check_config("importance_sampling", None) == {}


def _refused(match, fn, *args):
    with pytest.raises(LossInputError, match=match) as info:
        fn(*args)
    return str(info.value)


def test_unknown_and_unserved_losses_are_refused_with_the_reason():
    msg = _refused("'grpo'", required_inputs, "grpo")
    assert all(name in msg for name in SERVED_LOSSES)
    msg = _refused("'stable_reinforce'", required_inputs, "stable_reinforce")
    assert "stability" in msg and "loss_fn='importance_sampling'" in msg
    msg = _refused("'custom'", check_config, "custom", {"loss_id": 1.0})
    assert "custom loss" in msg and "off" in msg
    _refused("'grpo'", elementwise_loss, "grpo", torch.zeros(2), {}, {})


@pytest.mark.parametrize("loss_fn, config, field", [
    ("ppo", {"clip_eps": 0.2}, "'clip_eps'"),
    ("importance_sampling", {"clip_low_threshold": 0.8}, "'clip_low_threshold'"),
    ("cross_entropy", {"beta": 1.0}, "'beta'"),
    ("dro", {"beta": 0.1, "clip_high_threshold": 1.2}, "'clip_high_threshold'"),
    ("ppo", {"clip_low_threshold": 1.1}, r'loss_fn_config\["clip_low_threshold"\]'),
    ("cispo", {"clip_low_threshold": -0.1}, r'loss_fn_config\["clip_low_threshold"\]'),
    ("gspo", {"clip_high_threshold": 0.2}, r'loss_fn_config\["clip_high_threshold"\]'),
    ("ppo", {"clip_high_threshold": float("nan")}, r'loss_fn_config\["clip_high_threshold"\]'),
    ("ppo", {"clip_high_threshold": "1.2"}, r'loss_fn_config\["clip_high_threshold"\]'),
    ("dro", {}, r'loss_fn_config\["beta"\] is missing'),
    ("dro", {"beta": float("inf")}, r'loss_fn_config\["beta"\]'),
    ("dro", {"beta": -0.1}, r'loss_fn_config\["beta"\]'),
])
def test_bad_config_is_refused_naming_the_key(loss_fn, config, field):
    _refused(field, check_config, loss_fn, config)
    _refused(field, elementwise_loss, loss_fn, torch.zeros(3), {"logprobs": torch.zeros(3),
                                                                "advantages": torch.zeros(3)}, config)


def _gspo_inputs(n=5):
    return {"logprobs": torch.full((n,), -1.0), "advantages": torch.ones(n), "sequence_ratio_mask": torch.ones(n)}


def test_missing_input_is_refused_naming_it():
    msg = _refused(r'loss_fn_inputs\["advantages"\] is missing for loss \'ppo\'', elementwise_loss, "ppo",
                   torch.zeros(5), {"logprobs": torch.zeros(5)}, {})
    assert "target_tokens, logprobs, advantages" in msg
    inputs = _gspo_inputs()
    del inputs["sequence_ratio_mask"]
    _refused(r'loss_fn_inputs\["sequence_ratio_mask"\] is missing', elementwise_loss, "gspo", torch.zeros(5),
             inputs, {})


def test_wrong_shape_is_refused_naming_the_field_and_both_shapes():
    inputs = _gspo_inputs() | {"advantages": torch.ones(4)}
    msg = _refused(r'loss_fn_inputs\["advantages"\]', elementwise_loss, "gspo", torch.zeros(5), inputs, {})
    assert "(4,)" in msg and "(5,)" in msg
    msg = _refused(r'loss_fn_inputs\["weights"\]', elementwise_loss, "cross_entropy", torch.zeros(5),
                   {"weights": torch.ones(5, 1)}, {})
    assert "(5, 1)" in msg and "(5,)" in msg
    _refused(r'loss_fn_inputs\["clip_low_threshold"\]', elementwise_loss, "ppo", torch.zeros(5),
             _gspo_inputs() | {"clip_low_threshold": torch.full((6,), 0.8)}, {})


@pytest.mark.parametrize("field", ["logprobs", "advantages", "sequence_ratio_mask", "weights", "clip_high_threshold"])
def test_non_finite_input_is_refused_naming_it(field):
    inputs = _gspo_inputs() | {"weights": torch.ones(5), "clip_high_threshold": torch.full((5,), 1.2)}
    inputs[field] = inputs[field].clone()
    inputs[field][2] = float("nan")
    msg = _refused(rf'loss_fn_inputs\["{field}"\]', elementwise_loss, "gspo", torch.zeros(5), inputs, {})
    assert "position 2" in msg


def test_non_finite_target_logprobs_and_non_tensors_are_refused():
    t = torch.tensor([-1.0, float("-inf"), -2.0])
    _refused("target_logprobs", elementwise_loss, "cross_entropy", t, {}, {})
    _refused("target_logprobs", elementwise_loss, "cross_entropy", torch.tensor([1, 2]), {}, {})
    _refused(r'loss_fn_inputs\["weights"\] must be a tensor', elementwise_loss, "cross_entropy", torch.zeros(2),
             {"weights": [1.0, 1.0]}, {})


def test_bad_per_token_clip_bounds_are_refused_naming_the_field_and_position():
    inputs = _gspo_inputs() | {"clip_low_threshold": torch.tensor([0.8, 0.8, 0.8, 1.5, 0.8])}
    msg = _refused(r'loss_fn_inputs\["clip_low_threshold"\]', elementwise_loss, "ppo", torch.zeros(5), inputs, {})
    assert "position 3" in msg
    inputs = _gspo_inputs() | {"clip_high_threshold": torch.tensor([1.2, 0.9, 1.2, 1.2, 1.2])}
    _refused(r'loss_fn_inputs\["clip_high_threshold"\]', elementwise_loss, "cispo", torch.zeros(5), inputs, {})


def test_gspo_with_an_empty_sequence_ratio_mask_is_refused():
    inputs = _gspo_inputs() | {"sequence_ratio_mask": torch.zeros(5)}
    _refused(r'loss_fn_inputs\["sequence_ratio_mask"\] has no nonzero', elementwise_loss, "gspo", torch.zeros(5),
             inputs, {})
