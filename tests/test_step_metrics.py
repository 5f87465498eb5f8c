"""Each metric of an update is reduced by one declared rule, over a rank's micro-batches and over the ranks; and
every placement has its sampler fleet class, chosen in one factory."""
from __future__ import annotations

import pytest

from grpo_core.engine.results import TrainStep
from grpo_core.engine.train.step_metrics import REDUCTIONS, MicroBatchMetrics, merge_ranks, reduction


def test_micro_batches_sum_the_loss_per_step_and_keep_the_largest_difference():
    gathered = MicroBatchMetrics()
    # two optimizer steps of two micro-batches each
    for loss, clip, gap in ((1.0, 0.1, 0.5), (2.0, 0.3, 0.2), (3.0, 0.5, 0.9), (4.0, 0.7, 0.1)):
        gathered.add({"loss": loss, "clipfrac": clip, "mismatch_abs_logp_max": gap})
    out = gathered.result(steps=2)
    assert out["loss"] == pytest.approx((1 + 2 + 3 + 4) / 2)  # each step's micro-batch losses add up
    assert out["clipfrac"] == pytest.approx(0.4)  # a fraction is a mean
    assert out["mismatch_abs_logp_max"] == 0.9  # a largest difference stays the largest


def test_ranks_add_losses_and_tokens_take_the_slowest_and_agree_on_the_rest():
    ranks = [{"loss": 1.0, "pg_loss": 0.5, "tokens": 10.0, "seconds": 2.0, "mismatch_abs_logp_max": 0.1,
              "lr": 1e-3, "grad_norm": 3.0, "clipfrac": 0.2},
             {"loss": 2.0, "pg_loss": 0.25, "tokens": 30.0, "seconds": 5.0, "mismatch_abs_logp_max": 0.4,
              "lr": 1e-3, "grad_norm": 9.0, "clipfrac": 0.4}]
    out = merge_ranks(ranks)
    assert out == pytest.approx({"loss": 3.0, "pg_loss": 0.75, "tokens": 40.0, "seconds": 5.0,
                                 "mismatch_abs_logp_max": 0.4, "lr": 1e-3, "grad_norm": 3.0, "clipfrac": 0.3})
    step = TrainStep.merge([TrainStep(ranks[0], 7), TrainStep(ranks[1], 7)])
    assert step.learners == 2 and step.policy_version == 7 and step.to_json()["learners"] == 2


def test_every_declared_rule_is_one_the_reducers_know():
    assert all(r.micro in ("mean", "max", "step_sum") and r.ranks in ("mean", "sum", "max", "same")
               for r in REDUCTIONS.values())
    assert reduction("entropy").micro == "mean" and reduction("entropy").ranks == "mean"  # undeclared: a mean


def test_every_placement_has_one_fleet_class():
    from grpo_core.cluster.fleet import FLEETS, ActorFleet, ColocatedFleet, ServerFleet
    from grpo_core.config.placements import PLACEMENTS

    assert set(FLEETS) == set(PLACEMENTS)
    assert {k: v.__name__ for k, v in FLEETS.items()} == {"colocate": ColocatedFleet.__name__,
                                                          "split": ActorFleet.__name__,
                                                          "external": ServerFleet.__name__}
