"""PPO with a critic through the grpo-train flow on the tiny model (one answer per prompt): the critic trains beside
the policy in the learner, its figures are in every row, its state in every checkpoint, and a run resumed after a
SIGKILL inside an update ends bit-identical to one run straight through (the critic's weights and optimizer
restored)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from grpo_core.run import checkpoint
from grpo_core.run.storage import RunStore
from tests.cli_runs import kill_tree, learning_rows, start_cli, stop_once_listed, weights_differing
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ITERATIONS = 4
CRITIC = ("value_loss", "value_clipfrac", "value_explained_var", "values_mean", "returns_mean", "vpred_mean",
          "critic_grad_norm", "critic_lr")
LEARNING = ("iteration", "policy_version", "reward_mean", "loss", "grad_norm", "lr", "eval_accuracy", *CRITIC)


def ppo_config(tiny_model: str, root: Path, run_name: str, iterations: int = ITERATIONS) -> dict:
    return tiny_config(tiny_model, str(root), run_name=run_name, iterations=iterations, algo={"preset": "ppo"},
                       critic={"lr": 1e-3}, rollout__prompts_per_iteration=16, rollout__samples_per_prompt=1,
                       train__lr=1e-3, train__mini_batch_size=8, train__micro_batch_size=8, eval__interval=2,
                       checkpoint__interval=2)


@pytest.fixture(scope="module")
def ppo_run(tiny_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("ppo")
    return grpo_train(config=ppo_config(tiny_model, root, "ppo")), root


def test_the_critic_trains_beside_the_policy_and_is_checkpointed_with_it(ppo_run):
    result, root = ppo_run
    store = RunStore(str(root), "ppo")
    rows = store.read_metrics().to_pylist()
    trained = rows[:ITERATIONS]
    assert [r["policy_version"] for r in trained] == [0, 2, 4, 6]  # two mini-batches: two steps of each model
    for r in trained:
        # explained variance is undefined (null) in an iteration whose answers all scored alike
        assert all(math.isfinite(r[k]) for k in CRITIC if k != "value_explained_var"), r
        assert r["critic_lr"] == pytest.approx(1e-3) and r["value_loss"] >= 0
        assert 0 < r["critic_seconds"] < r["time_train_s"]  # inside the update's time, not "overhead"
        if r["reward_mean"] > 0:  # returns to fit (a new head at zero fits all-zero returns exactly)
            assert r["value_loss"] > 0
        # a few iterations old, the critic explains little of its returns
        assert r["value_explained_var"] is None if r["reward_mean"] == 0 else r["value_explained_var"] < 0.5
    assert any(r["reward_mean"] > 0 for r in trained)  # some answers right: the critic had a spread to learn
    batch = store.get_table(1, "scored.parquet")
    assert batch.num_rows == 16 and batch.column("advantage").to_pylist() == [0.0] * 16  # per token, in the learner
    ckpt = root / "ppo" / "checkpoints" / "iter-000001"
    assert (ckpt / "critic" / "mp_rank_00_model_states.pt").exists()
    assert (ckpt / "learner" / "mp_rank_00_model_states.pt").exists()
    assert result["final_eval_accuracy"] == rows[-1]["eval_accuracy"]


@pytest.mark.e2e  # make test: the run itself, above; the critic's own snapshot and load: tests/test_critic.py
def test_a_ppo_run_sigkilled_inside_its_update_resumes_bit_identical(ppo_run, tiny_model, tmp_path, prefect_harness):
    """`grpo train`'s whole process tree SIGKILLed once iteration 3's batch is scored, both models inside their
    update; the next start resumes from iteration 1's checkpoint (the policy's and the critic's DeepSpeed states)
    and ends as the run straight through: the same final weights, the same rows (the critic's figures depend on its
    weights and its optimizer's moments) and the same critic in iteration 3's checkpoint."""
    from flows.grpo_train import grpo_train

    _, root = ppo_run
    cfg = ppo_config(tiny_model, tmp_path, "cut")
    store = RunStore(str(tmp_path), "cut")
    proc, log = start_cli(cfg, tmp_path, "first")
    stop_once_listed(store, proc, log, 3, "scored.parquet", near=(3, "rollouts.parquet"))
    kill_tree(proc)
    assert store.entry(3, "train.json") is None, "the kill was meant to land inside iteration 3's update"
    assert checkpoint.latest(store).iteration == 1
    resumed = grpo_train(config=cfg)
    assert resumed["resumed_from"] == "iter-000001"
    assert weights_differing(tmp_path, "cut", root, "ppo") == []
    assert learning_rows(tmp_path, "cut", LEARNING) == learning_rows(root, "ppo", LEARNING)
    critic = [torch.load(r / "checkpoints" / "iter-000003" / "critic" / "mp_rank_00_model_states.pt",
                         weights_only=False)["module"] for r in (root / "ppo", tmp_path / "cut")]
    assert critic[0].keys() == critic[1].keys()
    assert all(torch.equal(critic[0][k], critic[1][k]) for k in critic[0])
