"""pass@k (Chen et al. 2021's unbiased estimator) against hand-computed values, and its metrics per eval set."""
from __future__ import annotations

import math
from fractions import Fraction

import pyarrow as pa
import pytest
import torch

from grpo_core.algo import pass_at_k


def test_hand_computed_values():
    n = torch.tensor([5, 5, 5, 10, 4, 3])
    c = torch.tensor([2, 2, 2, 0, 1, 3])
    # 1 - C(3,1)/C(5,1) = 2/5; 1 - C(3,2)/C(5,2) = 7/10; n - c = 3 < 4: 1; c = 0: 0; 1 - C(3,3)/C(4,3) = 3/4; all right
    assert pass_at_k(n[:1], c[:1], 1)[0].tolist() == pytest.approx([0.4])
    assert pass_at_k(n[1:2], c[1:2], 2)[0].tolist() == pytest.approx([0.7])
    assert pass_at_k(n[2:3], c[2:3], 4)[0].tolist() == [1.0]
    assert pass_at_k(n[3:4], c[3:4], 3)[0].tolist() == [0.0]
    assert pass_at_k(n[4:5], c[4:5], 3)[0].tolist() == pytest.approx([0.75])
    values, metrics = pass_at_k(n[4:], c[4:], 1)  # 1/4 and 1
    assert values.tolist() == pytest.approx([0.25, 1.0]) and metrics == {"pass@1": pytest.approx(0.625)}


def test_pass_at_1_is_the_fraction_correct_and_pass_at_n_is_any_correct():
    n, c = torch.full((4,), 8), torch.tensor([0, 1, 5, 8])
    assert pass_at_k(n, c, 1)[0].tolist() == pytest.approx([0, 1 / 8, 5 / 8, 1])
    assert pass_at_k(n, c, 8)[0].tolist() == [0.0, 1.0, 1.0, 1.0]


def test_stable_where_the_binomials_overflow_floats():
    n, c, k = 1200, 37, 300  # C(1200, 300) ~ 1e285 fits, C(1163, 300) / C(1200, 300) needs exact arithmetic
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    value = pass_at_k(torch.tensor([n]), torch.tensor([c]), k)[0].item()
    assert value == pytest.approx(float(exact), rel=1e-12)
    big = pass_at_k(torch.tensor([5000]), torch.tensor([3]), 2000)[0].item()  # C(5000, 2000) overflows a float
    assert big == pytest.approx(float(1 - Fraction(math.comb(4997, 2000), math.comb(5000, 2000))), rel=1e-12)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(torch.tensor([2]), torch.tensor([1]), 3)
    with pytest.raises(ValueError, match=r"\[0, num_samples\]"):
        pass_at_k(torch.tensor([4]), torch.tensor([5]), 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(torch.tensor([4]), torch.tensor([1]), 0)


def test_set_metrics_from_scored_responses():
    from grpo_core.config import EvalDatasetConfig
    from grpo_core.pipeline.evaluation import EvalSet, set_metrics

    spec = EvalDatasetConfig(path="x.jsonl", reward_type="code", format="code", samples=4, pass_k=[1, 2, 4])
    eval_set = EvalSet(name="code", spec=spec, prompts=[{}, {}], source="x.jsonl")
    greedy = pa.table({"prompt_id": [0, 1], "accuracy": [1.0, 0.0], "reward": [1.0, None]})
    sampled = pa.table({"prompt_id": [0] * 4 + [1] * 4, "accuracy": [1.0, 0, 0, 1.0, 0, 0, 0, 0],
                        "reward": [1.0, 0, 0, 1.0, 0, 0, 0, 0]})
    m = set_metrics(eval_set, greedy, sampled)
    # prompt 0: n=4, c=2 -> pass@1 1/2, pass@2 1 - C(2,2)/C(4,2) = 5/6, pass@4 1; prompt 1: all 0
    assert m == {"eval/code/prompts": 2.0, "eval/code/accuracy": 0.5, "eval/code/pass@1": pytest.approx(0.25),
                 "eval/code/pass@2": pytest.approx(5 / 12), "eval/code/pass@4": 0.5, "eval/code/unscored": 1.0}
