"""Multi-turn episodes through the whole flow, on the tiny tool-use policy (`grpo model tiny-tools`): split
placement with async RL learns to call the calculator, and a run whose whole process tree is SIGKILLed mid-training
resumes to bit-identical final weights and learning metrics."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_core.run import checkpoint
from grpo_core.run.storage import RunStore
from tests.cli_runs import kill_once_listed, learning_rows, run_cli_to_end, weights_differing
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1800)]

ITERATIONS = 8
# What describes learning (timings, and each tool call's seconds in episode_turns, differ between runs by nature).
LEARNING = ("iteration", "policy_version", "reward_mean", "loss", "grad_norm", "lr", "entropy", "response_length_mean",
            "eval_accuracy", "turns_mean", "tool_calls_mean", "tool_call_frac", "tool_errors",
            "episode_truncated_frac", "staleness_max", "offpolicy_weight_mean")


def _config(model: str, root: Path, run_name: str) -> dict:
    """configs/tiny-tools.yaml, smaller: 16 prompts x 8 episodes, split placement, one iteration of staleness."""
    tree = yaml.safe_load((REPO / "configs/tiny-tools.yaml").read_text())
    tree.update(run_name=run_name, iterations=ITERATIONS)
    tree["model"]["path"] = model
    tree["data"].update(train_path=str(REPO / "data/tools/train.jsonl"), eval_path=str(REPO / "data/tools/eval.jsonl"))
    tree["storage"]["root"] = str(root)
    tree["rollout"].update(prompts_per_iteration=16, max_staleness=1)
    tree["eval"] = {"interval": 4, "greedy": True, "max_prompts": 48}
    tree["reward"]["num_workers"] = 1
    tree["checkpoint"] = {"interval": 2, "keep_last": 2}
    tree["cluster"] = {"placement": "split", "sampler_resources": {"num_cpus": 0.5}}
    return tree


def _rows(root: Path, run: str) -> list[dict]:
    return RunStore(str(root), run).read_metrics().to_pylist()


@pytest.fixture(scope="module")
def reference(tiny_tools_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("multiturn-reference")
    grpo_train(config=_config(tiny_tools_model, root, "ref"))
    return root


def test_split_async_multi_turn_learns_to_call_the_tool(reference):
    rows = _rows(reference, "ref")
    evals = [r["eval_accuracy"] for r in rows if r["eval_accuracy"] is not None]
    # held-out greedy accuracy: 0 (the policy answers without the tool) -> 0.79 at iteration 8 here
    assert evals[0] <= 0.2 and evals[-1] >= 0.6, evals
    calls = [r["tool_call_frac"] for r in rows if r["iteration"] < ITERATIONS]
    assert calls[-1] > calls[0] + 0.25, calls  # the policy learnt to call where a call pays off
    assert max(r["staleness_max"] for r in rows if r["iteration"] < ITERATIONS) == 1.0
    for r in rows[:ITERATIONS]:
        assert r["turns_mean"] >= 1.0 and r["env_errors"] == 0
        # after each sync the samplers' logprobs of episodes (the environment's tokens included) are the learner's
        assert r["sync_logprob_max_diff"] is None or r["sync_logprob_max_diff"] < 1e-3, r
    store = RunStore(str(reference), "ref")
    table = store.get_table(ITERATIONS - 1, "rollouts.parquet").to_pylist()
    called = [r for r in table if r["tool_calls"]]
    assert called, "the last iteration's episodes called the calculator"
    for r in called[:8]:
        turns = json.loads(r["episode_turns"])
        assert [t["role"] for t in turns[:3]] == ["assistant", "tool", "assistant"]
        call = turns[0]["tool_calls"][0]
        assert call["name"] == "calculator" and call["error"] is None
        a, b = (int(x) for x in call["input"].split("*"))
        assert call["output"] == str(a * b) and turns[1]["text"] == call["output"]
        tool_span = r["response_mask"][turns[1]["start"]:turns[1]["end"]]
        assert set(tool_span) == {0} and set(r["response_mask"][:turns[0]["end"]]) == {1}


def test_a_sigkilled_multi_turn_run_resumes_bit_identical(reference, tiny_tools_model, tmp_path):
    """The same run, its whole process tree SIGKILLed once iteration 5's batch is scored (async: while iteration 4
    trains beside that rollout), then resumed from its last checkpoint: the final weights and every
    learning metric equal the uninterrupted run's, one row per iteration. This is also the suite's SIGKILL of an
    async run mid-training (it was test_async.py's too, on single-answer rollouts: the same resume path)."""
    cfg = _config(tiny_tools_model, tmp_path, "cut")
    store = kill_once_listed(cfg, tmp_path, 5, "scored.parquet")
    committed = checkpoint.latest(store)
    assert committed is not None and committed.iteration in (1, 3), committed
    text = run_cli_to_end(cfg, tmp_path, "resumed")
    assert f"resuming cut from {committed.name}, policy version {committed.policy_version}" in text, text
    # The batches after the checkpoint were sampled by older weights than it holds: they were reused, not redone.
    assert store.entry(committed.iteration + 1, "rollouts.parquet").meta["policy_version"] < committed.policy_version
    differing = weights_differing(tmp_path, "cut", reference, "ref")
    assert not differing, f"final weights differ from the uninterrupted run in {differing}"
    assert learning_rows(tmp_path, "cut", LEARNING) == learning_rows(reference, "ref", LEARNING)
    assert [r["iteration"] for r in _rows(tmp_path, "cut")] == list(range(ITERATIONS + 1))
