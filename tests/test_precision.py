"""Precision: the sync check decided by digests (a sampler serving other weights fails the run, whatever the dtype),
the logprob gap measured beside it (a bound only when asked for), and a whole run in bfloat16."""
from __future__ import annotations

import pytest
import torch

from grpo_core.cluster.engines import SyncCheckFailed, check_gap, check_weights
from grpo_core.engine.precision import logprob_gap
from grpo_core.engine.weights_digest import Receipt, WeightsDigest
from tests.conftest import tiny_config


def test_the_sync_check_fails_on_a_sampler_with_other_weights_naming_it_and_the_tensor():
    state = {"a.weight": torch.randn(8, 4), "b.weight": torch.randn(4)}
    flipped = dict(state, **{"b.weight": -state["b.weight"]})
    published = Receipt(5, WeightsDigest.of(state.items()))
    good = Receipt(5, WeightsDigest.of(state.items()))
    assert check_weights(published, {0: good, 1: good}) == 2
    with pytest.raises(SyncCheckFailed, match=r"version 5, sampler\(s\) \[1\] serve other weights than the "
                                              r"learner published: sampler 1: b.weight: other bytes \(of 2 tensors"):
        check_weights(published, {0: good, 1: Receipt(5, WeightsDigest.of(flipped.items()))})
    with pytest.raises(SyncCheckFailed, match=r"sampler 0: serves version 4, not 5"):
        check_weights(published, {0: Receipt(4, good.digest)})


def test_the_logprob_gap_is_measured_and_bounded_only_when_asked():
    sampled = [[[-1.0, -2.0]], [[-0.5, -3.0]]]  # two samplers, one sequence each
    learned = [[-1.0, -2.0004], [-0.5, -3.2]]
    gap = logprob_gap([0, 1], sampled, learned)
    assert gap.max_diff == pytest.approx(0.2) and gap.per_sampler[0] == pytest.approx(4e-4)
    assert gap.tokens == 4 and gap.mean_diff == pytest.approx((4e-4 + 0.2) / 4)
    assert gap.p99_diff == pytest.approx(0.2)
    # k3 of KL(sampler || learner): r - 1 - log r per token with log r = learner - sampler, averaged
    expected_k3 = sum(__import__("math").expm1(d) - d for d in (0.0, -4e-4, 0.0, -0.2)) / 4
    assert gap.k3 == pytest.approx(expected_k3) and gap.k3 > 0
    check_gap(gap, None, "bfloat16")  # no bound by default: bf16 numerics are measured, not judged
    check_gap(gap, 0.25, "bfloat16")
    with pytest.raises(SyncCheckFailed, match=r"sampler\(s\) \[1\] differ from the learner beyond "
                                              r"weights.check_tolerance: .* up to 0\.2 .* above 0\.001 for float32"):
        check_gap(gap, 1e-3, "float32")


@pytest.mark.slow
@pytest.mark.e2e
def test_a_bfloat16_run_trains_and_its_syncs_pass_the_digest_check(tiny_model, tmp_path,
                                                                                   prefect_harness):
    """model.dtype bfloat16 through the flow: vLLM and DeepSpeed in bf16 (the BF16 optimizer: float32 masters), the
    policy saved in bf16, and every sync checked by digest (the bf16 tensors the learner sent are those vLLM was
    handed), with the logprob gap measured (here 8e-5 to 3e-4 on 4 sequences; 0.036 at most over 16 in-process)."""
    from safetensors.torch import load_file

    from flows.grpo_train import grpo_train
    from grpo_core.run.storage import RunStore

    cfg = tiny_config(tiny_model, str(tmp_path), model__dtype="bfloat16", weights__check_every=1, eval__interval=0,
                      rollout__prompts_per_iteration=4, train__lr=1e-3)
    grpo_train(config=cfg)
    rows = RunStore(str(tmp_path), "test").read_metrics().to_pylist()
    diffs = [r["sync_logprob_max_diff"] for r in rows]
    print(f"bfloat16: sync_logprob_max_diff {diffs}")
    assert len(diffs) == 2 and all(d is not None and d >= 0 for d in diffs)
    assert all(r["sync_tensors_checked"] > 0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)
    final = load_file(str(tmp_path / "test" / "final" / "model.safetensors"))
    assert {t.dtype for t in final.values()} == {__import__("torch").bfloat16}
