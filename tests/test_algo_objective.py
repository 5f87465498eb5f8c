"""The policy objective as one pure function, held against the loss the learner assembled inline before
(``tests/data/objective_reference.pt``: five saved micro-batches, made by ``Learner.train_step``'s own lines at
commit a84a0ef for the algorithm variants below; loss, both gradients and every metric).

The reference was saved on an AVX-512 Xeon; on an AVX2 EPYC torch's vectorized exp/log round a few elements one ulp
the other way (measured: 1 to 2 of 48 gradient elements, by at most 1.5e-7 relative; the losses equal to the bit), so
the comparison is to float32 rounding (2 ulps), not to the bit: any change of formula moves these by far more."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_core.algo.objective import policy_objective
from grpo_core.config import AlgoConfig

REFERENCE = torch.load(Path(__file__).parent / "data" / "objective_reference.pt")


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_objective_equals_the_learners_former_loss_to_float_rounding(name):
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
    _assert_rounding_close(loss.detach(), ref["loss"])
    _assert_rounding_close(logp.grad, ref["grad_logp"])
    assert (entropy.grad is None) == (ref["grad_entropy"] is None)
    if entropy.grad is not None:
        _assert_rounding_close(entropy.grad, ref["grad_entropy"])
    assert metrics.keys() == ref["metrics"].keys()
    for key, value in metrics.items():
        assert value == pytest.approx(ref["metrics"][key], rel=ROUNDING, abs=1e-12), key


ROUNDING = 2.5e-7  # two float32 ulps, relative


def _assert_rounding_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=ROUNDING, atol=1e-12)


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
