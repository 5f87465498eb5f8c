"""Stochastic rounding to bfloat16: exact bf16 values, one step either side, unbiased, reproducible from its seed."""
from __future__ import annotations

import pytest
import torch

from grpo_core.engine.train.bf16_rounding import stochastic_round_to_bf16


def test_rounds_to_a_neighbouring_bf16_value_unbiased_for_either_sign():
    step = 2.0 ** -7  # the bf16 step between 1 and 2
    for sign in (1.0, -1.0):
        value = sign * (1.0 + 0.3 * step)  # 30% of a step above 1 in magnitude
        master = torch.full((200_000,), value, dtype=torch.float32)
        out = stochastic_round_to_bf16(master, torch.Generator().manual_seed(0))
        assert torch.equal(out.to(torch.bfloat16).float(), out)  # exactly representable: the copy is exact
        assert sorted(out.unique().abs().tolist()) == [1.0, 1.0 + step]  # the two neighbours, nothing else
        assert (out.abs() > 1.0).double().mean().item() == pytest.approx(0.3, abs=0.01)  # up 30% of the time
        assert out.double().mean().item() == pytest.approx(value, abs=0.01 * step)  # unbiased
        assert master.to(torch.bfloat16).float()[0].item() == sign * 1.0  # to nearest: always down, 0.3 step off


def test_values_already_in_bf16_stay_and_the_same_seed_gives_the_same_copy():
    exact = torch.randn(10_000).to(torch.bfloat16).float()
    assert torch.equal(stochastic_round_to_bf16(exact, torch.Generator().manual_seed(3)), exact)
    noisy = torch.randn(10_000)
    a = stochastic_round_to_bf16(noisy, torch.Generator().manual_seed(5))
    b = stochastic_round_to_bf16(noisy, torch.Generator().manual_seed(5))
    c = stochastic_round_to_bf16(noisy, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert ((a - noisy).abs() <= noisy.abs() * 2.0 ** -7).all()  # within one bf16 step
