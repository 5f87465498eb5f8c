"""Multi-turn episodes through the whole flow, on the tiny tool-use policy (`grpo model tiny-tools`): split
placement with async RL learns to call the calculator.

Not here yet: a SIGKILLed multi-turn run resuming bit-identical. Two uninterrupted runs of this configuration already
differ in the learner's loss in the 8th digit from iteration 1 on (same rollouts, same rewards), which single-turn
runs of the same placement do not; the cause is not found yet (not the thread count, not the checkpoint writer)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_core.storage import RunStore
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1800)]

ITERATIONS = 8


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
