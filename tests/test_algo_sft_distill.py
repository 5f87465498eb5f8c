"""The objectives beside the policy gradient, against hand computations: SFT's likelihood loss (with the objective
chosen by kind, as the learner chooses it) and on-policy distillation's per-token advantage."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_core.algo.distill import distillation_advantages
from grpo_core.algo.losses import loss_denominator
from grpo_core.algo.objective import (ObjectiveInputs, PolicyGradient, Supervised, make_objective,
                                      supervised_objective)
from grpo_core.config import AlgoConfig


def _logprobs(seed: int, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(shape[0], shape[1], 7, generator=g), dim=-1)[..., 0]


def test_sft_loss_is_the_cross_entropy_of_the_masked_tokens_over_the_mini_batch():
    logp = _logprobs(0).requires_grad_()
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 1]], dtype=torch.float32)
    entropy = torch.ones_like(logp)
    # the whole mini-batch has 6 target tokens; this micro-batch is its first two rows (5 of them)
    loss, metrics = supervised_objective(logp[:2], mask[:2], entropy=entropy[:2], denominator=6.0)
    by_hand = -(logp[0, 0] + logp[0, 1] + logp[1, 1] + logp[1, 2] + logp[1, 3]) / 6
    assert float(loss.detach()) == pytest.approx(float(by_hand.detach()), abs=1e-6)
    assert metrics["nll"] == pytest.approx(float(by_hand) * 6 / 5, abs=1e-6)  # this micro-batch's own mean
    rest, _ = supervised_objective(logp[2:], mask[2:], entropy=entropy[2:], denominator=6.0)
    whole, _ = supervised_objective(logp, mask, entropy=entropy, denominator=loss_denominator(mask, "token_mean"))
    assert float((loss + rest).detach()) == pytest.approx(float(whole.detach()), abs=1e-6)  # micro-batches sum to the mini-batch's
    whole.backward()
    assert torch.equal(logp.grad == 0, mask == 0)  # no gradient outside the target tokens


def test_the_objective_is_chosen_by_kind_and_sft_ignores_advantages_and_old_logprobs():
    algo = AlgoConfig()
    assert isinstance(make_objective("policy_gradient", algo), PolicyGradient)
    sft = make_objective("sft", algo)
    assert isinstance(sft, Supervised) and not sft.uses_old_logprobs
    logp, mask = _logprobs(1), torch.ones(3, 5)
    base = ObjectiveInputs(logp, logp - 1.0, torch.tensor([5.0, -2.0, 0.0]), mask, entropy=torch.zeros(3, 5),
                           denominator=15.0, norm_length=5)
    other = ObjectiveInputs(logp, logp + 3.0, torch.zeros(3), mask, entropy=torch.zeros(3, 5), denominator=15.0,
                            norm_length=5)
    assert float(sft(base)[0]) == float(sft(other)[0]) == pytest.approx(float(-logp.mean()), abs=1e-6)
    assert sft.agg_mode == "token_mean" != algo.loss_agg_mode  # SFT's mean is over tokens whatever RL's is
    with pytest.raises(ValueError, match="unknown objective 'dpo'"):
        make_objective("dpo", algo)


def test_distillation_advantage_is_teacher_minus_student_on_sampled_tokens_mixed_with_the_reward():
    student = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-3.0, -0.1, -0.2, -0.3]])
    teacher = torch.tensor([[-0.5, -2.5, -0.5, -9.0], [-1.0, -0.1, -4.2, -7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    adv, m = distillation_advantages(student, teacher, mask)
    assert adv.flatten().tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 2.0, 0.0, -4.0, -6.7], abs=1e-6)
    # reverse KL per token (k1): mean of student - teacher over the 7 sampled tokens
    assert m["reverse_kl"] == pytest.approx((-0.5 + 0.5 + 0 - 2.0 + 0 + 4.0 + 6.7) / 7, abs=1e-6)
    assert m["teacher_logprob_mean"] == pytest.approx((-0.5 - 2.5 - 0.5 - 1.0 - 0.1 - 4.2 - 7.0) / 7, abs=1e-6)
    mixed, _ = distillation_advantages(student, teacher, mask, reward_advantages=torch.tensor([1.0, -1.0]),
                                       reward_weight=0.5)
    assert mixed.flatten().tolist() == pytest.approx([1.0, 0.0, 0.5, 0.0, 1.5, -0.5, -4.5, -7.2], abs=1e-6)
    top = torch.tensor([[7, 8, 9, 0], [1, 2, 3, 4]])
    sampled = torch.tensor([[7, 0, 9, 0], [0, 2, 0, 4]])
    _, agree = distillation_advantages(student, teacher, mask, teacher_top_ids=top, sampled_ids=sampled)
    assert agree["teacher_agreement"] == pytest.approx(4 / 7)  # position [0, 3] is out of the mask
    with pytest.raises(ValueError, match="no reward_advantages"):
        distillation_advantages(student, teacher, mask, reward_weight=1.0)
    with pytest.raises(ValueError, match="same"):
        distillation_advantages(student, teacher[:, :3], mask)
    assert math.isfinite(m["reverse_kl"])
