"""The difficulty pool (data.sampler: difficulty_pool): which prompts each iteration draws against hand-worked
walks of the epoch order, and its state through JSON. Runs with it on the real stack, SIGKILLed and resumed (the
same prompts, metrics and final weights as the uninterrupted run), are tests/test_resume.py's: all of them draw
through the pool."""
from __future__ import annotations

import json

import numpy as np
import pytest

from grpo_core.pipeline.difficulty_pool import DifficultyPool, GroupOutcome, PoolState

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
