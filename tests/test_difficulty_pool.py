"""The difficulty pool (data.sampler: difficulty_pool): which prompts each iteration draws against hand-worked
walks of the epoch order, its state through JSON, and a run that is SIGKILLed and resumed with it: the same prompts,
metrics and final weights as the uninterrupted run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from grpo_core import checkpoint
from grpo_core.pipeline.difficulty_pool import DifficultyPool, GroupOutcome, PoolState
from grpo_core.storage import RunStore
from tests.cli_runs import kill_tree, learning_rows, run_cli_to_end, start_cli, wait_listed, weights_differing
from tests.conftest import REPO, tiny_config

# epoch 0: 0..5, epoch 1: 5..0, then 0..5 again
ORDERS = {0: np.arange(6), 1: np.arange(6)[::-1]}
IDS = [10, 11, 12, 13, 14, 15]  # the dataset's prompt_id of each index
OUTCOMES = {
    # iteration 0 drew [0, 1]: index 0 all right (easy), index 1 mixed; an inbox group and a group whose prompt_id
    # does not match the selection are not ours
    0: [GroupOutcome(0, 10, 1.0), GroupOutcome(1, 11, 0.5), GroupOutcome(5, 99, 0.0), GroupOutcome(1, 42, 0.0)],
    1: [GroupOutcome(0, 12, 0.0), GroupOutcome(1, 13, 0.25)],  # drew [2, 3]: index 2 all wrong (hard)
}


def _pool(easy=1, hard=1, outcomes=None):
    asked = []

    def read(iteration):
        asked.append(iteration)
        return (outcomes or OUTCOMES).get(iteration, [])

    pool = DifficultyPool(6, lambda e: ORDERS.get(e, np.arange(6)), 2, IDS, read, easy, hard)
    return pool, asked


def test_retired_prompts_are_passed_over_at_their_next_turn_then_come_back():
    pool, asked = _pool()
    assert [pool.selection(i) for i in range(6)] == [[0, 1], [2, 3], [4, 5], [5, 4], [3, 1], [0, 1]]
    # iteration 4 passes over 2 (hard) once, iteration 5 passes over 0 (easy) once, then both are back
    assert [pool.state(i).skipped for i in range(6)] == [0, 0, 0, 0, 1, 1]
    assert pool.metrics(2) == {"pool_active": 4, "pool_easy": 1, "pool_hard": 1, "pool_skipped": 0}
    assert pool.metrics(5) == {"pool_active": 6, "pool_easy": 0, "pool_hard": 0, "pool_skipped": 1}
    assert asked == [0, 1, 2, 3, 4]  # each iteration's outcomes read once, before the next draw


def test_skips_count_turns_and_zero_never_retires():
    pool, _ = _pool(easy=2, hard=0)
    # index 2 (hard) is never out; index 0 (easy) is passed over at its turn in epoch 1 (position 11) and again at
    # its turn in epoch 2 (position 12), both inside iteration 5's walk, which so takes index 1 twice
    assert [pool.selection(i) for i in range(8)] == [[0, 1], [2, 3], [4, 5], [5, 4], [3, 2], [1, 1], [2, 3],
                                                     [4, 5]]
    assert [pool.metrics(i)["pool_easy"] for i in range(6)] == [0, 1, 1, 1, 1, 0]
    assert pool.metrics(5)["pool_skipped"] == 2 and pool.metrics(4)["pool_hard"] == 0


def test_a_pool_restored_from_its_json_state_draws_what_the_uninterrupted_one_does():
    whole, _ = _pool()
    expected = [whole.selection(i) for i in range(6)]
    first, _ = _pool()
    first.selection(3)
    doc = json.loads(json.dumps(first.state(3).to_json()))
    resumed, asked = _pool()
    resumed.restore(PoolState.from_json(doc))
    assert [resumed.selection(i) for i in range(3, 6)] == expected[3:]
    assert asked == [3, 4]  # replayed from the checkpoint's iteration, not from the start
    with pytest.raises(ValueError, match="no state before iteration 2"):
        resumed.selection(2)


# ------------------------------------------------------------------------------------------ the real stack

ITERATIONS = 6
LEARNING = ("iteration", "policy_version", "reward_mean", "accuracy_mean", "loss", "grad_norm", "entropy",
            "pool_active", "pool_easy", "pool_hard", "pool_skipped", "rollout_tokens", "eval_accuracy")


def _config(tiny_model: str, root: Path, run: str, train: Path) -> dict:
    return tiny_config(tiny_model, str(root), run_name=run, iterations=ITERATIONS, data__train_path=str(train),
                       data__sampler="difficulty_pool", rollout__prompts_per_iteration=4,
                       rollout__samples_per_prompt=4, train__micro_batch_size=16, train__lr=1e-3,
                       eval__interval=3, eval__max_prompts=8, checkpoint__interval=2, checkpoint__keep_last=2)


@pytest.mark.slow
@pytest.mark.e2e  # make test: test_a_pool_restored_from_its_json_state_draws_what_the_uninterrupted_one_does
@pytest.mark.timeout(900)
def test_sigkill_then_resume_with_the_difficulty_pool_is_exact(tiny_model, tmp_path, prefect_harness):
    """Ten train prompts, four per iteration: the untrained policy gets most groups all wrong, so the later
    iterations pass over prompts. Killed after iteration 3's rollout (the last checkpoint is iteration 1's), then
    resumed: the pool restored from the checkpoint draws the same prompts, and the run ends bit-identical."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join((REPO / "data/arith/train.jsonl").read_text().splitlines(keepends=True)[:10]))
    from flows.grpo_train import grpo_train

    grpo_train(config=_config(tiny_model, tmp_path / "ref", "ref", train))  # the uninterrupted reference
    cfg = _config(tiny_model, tmp_path / "cut", "cut", train)
    store = RunStore(str(tmp_path / "cut"), "cut")
    proc, log = start_cli(cfg, tmp_path, "first")
    wait_listed(store, 3, "rollouts.parquet", proc, log)
    kill_tree(proc)
    committed = checkpoint.latest(store)
    assert committed is not None and committed.iteration == 1, committed
    state = store.get_json_file(f"{committed.path}/prompt_pool.json")
    assert state["iteration"] == 1 and len(state["selection"]) == 4
    assert "prompt_pool.json" in store.get_json_file(f"{committed.path}/MANIFEST.json")["files"]

    text = run_cli_to_end(cfg, tmp_path, "resumed")
    assert f"resuming cut from {committed.name}" in text, text
    rows = learning_rows(tmp_path / "cut", "cut", LEARNING)
    assert rows == learning_rows(tmp_path / "ref", "ref", LEARNING)
    assert not weights_differing(tmp_path / "cut", "cut", tmp_path / "ref", "ref")
    assert sum(r["pool_skipped"] or 0 for r in rows) > 0, rows  # the pool did pass prompts over
    prompts = [sorted(RunStore(str(tmp_path / run), run).get_table(i, "rollouts.parquet")
                      .column("prompt_id").unique().to_pylist()) for run in ("ref", "cut") for i in range(ITERATIONS)]
    assert prompts[:ITERATIONS] == prompts[ITERATIONS:]
