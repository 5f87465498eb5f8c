"""Data-parallel learner ranks: one optimizer step on 2 ranks (gloo, two processes) equals the step one rank takes
on the whole batch, for ZeRO-2 and ZeRO-3."""
from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _config(model: str, learners: int, zero: int, **train):
    from grpo_core.config import build_config

    return build_config({"model": {"path": model}, "data": {"train_path": "t", "max_prompt_tokens": 10},
                         "rollout": {"prompts_per_iteration": 2, "samples_per_prompt": 4, "max_new_tokens": 10},
                         "cluster": {"placement": "split", "learners": learners},
                         "algo": {"loss_agg_mode": "token_mean"},
                         "train": {"lr": 1e-4, "micro_batch_size": 2, "zero_stage": zero, **train}})


def _learner(model: str, learners: int, zero: int, **train):
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    cfg = _config(model, learners, zero, **train)
    return Learner(LearnerSpec(model_path=model, total_steps=10), cfg.algo, cfg.train,
                   micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)


# token-budget: each rank plans every rank's micro-batches by tokens; a rank whose rows pack into fewer splits them so
# both run as many (ZeRO-2 reduces in every backward): rows of 8-12 tokens, shares of 2 rows, a budget of 22
CASES = {"zero3": (3, {}), "zero2-minibatches-epochs": (2, {"mini_batch_size": 4, "ppo_epochs": 2}),
         "zero2-token-budget": (2, {"mini_batch_size": 4, "max_tokens_per_microbatch": 22})}


def _rank_main(rank: int, port: int, model: str, out: str) -> None:
    """One rank of the group: every case in turn, one learner each, in one process (two processes for all cases:
    a rank's start, torch's and DeepSpeed's imports, is most of its time)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from grpo_core.engine.roles.learner import init_learner_group
    from tests.test_learner import _batch

    init_learner_group("127.0.0.1", port, rank, 2)
    results = {}
    for name, (zero, train) in CASES.items():
        learner = _learner(model, 2, zero, **train)
        metrics = learner.train_step(_batch(), rank=rank, world_size=2)
        weights = dict(learner.named_weights())  # every rank (ZeRO-3 gathers collectively)
        results[name] = {"weights": weights, "metrics": metrics} if rank == 0 else {"metrics": metrics}
        del learner
    torch.save(results, f"{out}.rank{rank}")
    # Leave the group before the interpreter exits: a rank that exited holding it once aborted in its teardown
    # ("terminate called without an active exception", SIGABRT) after its results were written.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tiny_model, tmp_path_factory) -> tuple[dict, dict]:
    """Every case's step on a group of 2 ranks: (rank 0's results, rank 1's), by case name."""
    ctx = mp.get_context("spawn")
    out = str(tmp_path_factory.mktemp("dp") / "dp.pt")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, tiny_model, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0, f"rank process failed with {p.exitcode}"
    return tuple(torch.load(f"{out}.rank{r}", weights_only=False) for r in range(2))


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_step_equals_one_rank_on_the_whole_batch(tiny_model, two_ranks, case):
    from tests.test_learner import _batch

    zero, train = CASES[case]
    dp, rank1 = two_ranks[0][case], two_ranks[1][case]
    single = _learner(tiny_model, 1, zero, **train)
    metrics = single.train_step(_batch())
    ref = dict(single.named_weights())
    initial = dict(_learner(tiny_model, 1, zero, **train).named_weights())
    worst = max(float((ref[k] - dp["weights"][k]).abs().max()) for k in ref)
    moved = max(float((ref[k] - initial[k]).abs().max()) for k in ref)
    assert moved > 5e-5, "the step must move the weights for the comparison to mean anything"
    # Float sums in another order differ by ~1e-7 in a gradient; over several Adam steps (mini-batches x epochs) a
    # weight whose gradient is that small moves by a sizeable part of lr either way (Adam divides by sqrt(v)), so
    # the bound is a tenth of lr = 1e-4 (measured: 6.8e-6 on one build of the tiny model, under 1e-6 on an earlier
    # one). A wrong share, scale or order of the ranks' data moves weights by ~lr.
    assert worst < 1e-5, f"2-rank step differs from the 1-rank step by {worst}"
    # the ranks' loss parts add up to the whole mini-batch loss
    assert dp["metrics"]["loss"] + rank1["metrics"]["loss"] == pytest.approx(metrics["loss"], abs=1e-6)
