"""The policy objective as one pure function, held to the bit against the loss the learner assembled inline before
(``tests/data/objective_reference.pt``: five saved micro-batches, made by ``Learner.train_step``'s own lines at
commit a84a0ef for the algorithm variants below; loss, both gradients and every metric)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_core.algo.objective import policy_objective
from grpo_core.config_sections import AlgoConfig

REFERENCE = torch.load(Path(__file__).parent / "data" / "objective_reference.pt")


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_objective_equals_the_learners_former_loss_to_the_bit(name):
    ref = REFERENCE[name]
    x = ref["inputs"]
    logp = x["logp"].clone().requires_grad_(True)
    entropy = x["entropy"].clone().requires_grad_(True)
    loss, metrics = policy_objective(
        logp, x["old"], x["adv"], x["mask"], AlgoConfig(**ref["algo"]), entropy=entropy,
        denominator=ref["denominator"], norm_length=ref["norm_length"],
        sampler_logprobs=x["sampler"] if ref["has_sampler"] else None,
        ref_logprobs=x["ref"] if ref["has_ref"] else None)
    loss.backward()
    assert torch.equal(loss.detach(), ref["loss"])
    assert torch.equal(logp.grad, ref["grad_logp"])
    assert (entropy.grad is None) == (ref["grad_entropy"] is None)
    if entropy.grad is not None:
        assert torch.equal(entropy.grad, ref["grad_entropy"])
    assert metrics == ref["metrics"]


def test_each_term_moves_the_loss_it_should():
    """The saved variants differ in what they switch on; each switch must change the result (else the reference
    above would not cover it)."""
    ref = REFERENCE["gspo_icepop_kl"]
    x = ref["inputs"]

    def value(**changes) -> float:
        algo = AlgoConfig(**{**ref["algo"], **changes})
        loss, _ = policy_objective(x["logp"], x["old"], x["adv"], x["mask"], algo, entropy=x["entropy"],
                                   denominator=9.0, norm_length=16, sampler_logprobs=x["sampler"],
                                   ref_logprobs=x["ref"])
        return float(loss)

    base = value()
    assert value(kl_coeff=0.0) != base
    assert value(kl_in_reward=True) == value(kl_coeff=0.0)  # the KL went into the reward: not in the loss
    assert value(entropy_coeff=0.1) < base  # the bonus lowers the loss by the (positive) entropy
    assert value(offpolicy="none") != base
