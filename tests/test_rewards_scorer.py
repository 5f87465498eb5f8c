"""The process-pool Scorer on math: correct/wrong/missing answers, bad gold, hostile input within the time budget,
killed and dead workers replaced, the pool reused across calls."""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from grpo_core.rewards.scorer import RewardResult, Scorer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def boxed_scorer():
    with Scorer(reward_type="boxed", num_workers=2, timeout_s=2.0) as scorer:
        yield scorer


def test_boxed_accuracy_scores_right_wrong_and_missing(boxed_scorer):
    completions = ["so the answer is \\boxed{7}", "\\boxed{8}", "I do not know", "\\boxed{\\frac{14}{2}}"]
    results = boxed_scorer.score(completions, [{"gt_answer": "7"}] * 4)
    assert [r.reward for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert all(r.error is None for r in results)
    assert results[0] == RewardResult(1.0, {"accuracy": 1.0}, None)


def test_order_is_kept_over_a_large_batch(boxed_scorer):
    completions = [f"\\boxed{{{i}}}" for i in range(200)]
    rows = [{"gt_answer": str(i if i % 3 else i + 1)} for i in range(200)]
    results = boxed_scorer.score(completions, rows)
    assert [r.reward for r in results] == [0.0 if i % 3 == 0 else 1.0 for i in range(200)]


def test_unusable_gold_gives_none_with_reason_and_keeps_place(boxed_scorer):
    results = boxed_scorer.score(["\\boxed{1}", "\\boxed{1}", "\\boxed{1}"],
                                 [{"gt_answer": "1"}, {"gt_answer": "\\frac{"}, {"other": "1"}])
    assert results[0].reward == 1.0
    assert results[1].reward is None and "gt_answer" in results[1].error and "parsed" in results[1].error
    assert results[2].reward is None and "no 'gt_answer' field" in results[2].error
    assert results[1].components == {"accuracy": None}


@pytest.mark.timeout(30)  # the soft alarm or, at worst, the hard kill ends it (math-verify alone would not)
def test_hostile_latex_comes_back_within_the_timeout_as_wrong(boxed_scorer):
    hostile = "\\boxed{9^{9^{9^{9^{9}}}}}"
    results = boxed_scorer.score([hostile, "\\boxed{7}"], [{"gt_answer": "7"}, {"gt_answer": "7"}])
    assert results[0].reward == 0.0 and results[0].components == {"accuracy": 0.0}
    assert "counted as wrong" in results[0].error
    assert results[1].reward == 1.0


def test_mismatched_lengths_are_rejected(boxed_scorer):
    with pytest.raises(ValueError, match="2 completions but 1 rows"):
        boxed_scorer.score(["a", "b"], [{"gt_answer": "1"}])


@pytest.fixture()
def hostile_plugin(tmp_path):
    path = tmp_path / "hostile_plugin.py"
    path.write_text(textwrap.dedent("""
        import os, signal, time

        def behave(completions, **columns):
            out = []
            for text in completions:
                if text == "hang":               # ignores the soft alarm: only the hard kill ends it
                    signal.signal(signal.SIGALRM, signal.SIG_IGN)
                    time.sleep(60)
                if text == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                out.append(float(len(text)))
            return out
    """))
    return f"{path}:behave"


@pytest.mark.timeout(60)  # the hung worker sleeps 60 s: only its hard kill lets the test end in time
def test_stuck_and_dead_workers_are_replaced_and_rows_keep_their_place(hostile_plugin):
    with Scorer(reward_type="boxed", rewards=["accuracy", hostile_plugin], weights=[1.0, 0.0],
                num_workers=2, timeout_s=0.5) as scorer:
        completions = ["\\boxed{7}", "hang", "\\boxed{7}", "die", "\\boxed{7}"]
        results = scorer.score(completions, [{"gt_answer": "7"}] * 5)
        assert [r.reward for r in results] == [1.0, None, 1.0, None, 1.0]
        assert "hard limit" in results[1].error and results[1].components["accuracy"] == 0.0
        assert "died" in results[3].error and results[3].components["behave"] is None
        assert scorer.workers_replaced == 2
        again = scorer.score(["\\boxed{7}"] * 4, [{"gt_answer": "7"}] * 4)  # the replaced pool still serves
        assert [r.reward for r in again] == [1.0] * 4


def test_worker_processes_stop_on_close():
    scorer = Scorer(reward_type="boxed", num_workers=2, timeout_s=1.0)
    pids = [worker.process.pid for worker in scorer._pool._workers]
    assert scorer.score(["\\boxed{2}"], [{"gt_answer": "2"}])[0].reward == 1.0
    scorer.close()
    scorer.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
