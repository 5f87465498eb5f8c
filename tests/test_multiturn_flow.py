"""Multi-turn episodes through the whole flow, on the tiny tool-use policy (`grpo model tiny-tools`): split
placement with async RL learns to call the calculator, and a run SIGKILLed mid-training resumes bit-identical."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_core import checkpoint
from grpo_core.storage import RunStore
from tests.cli_runs import kill_tree, run_cli_to_end, start_cli, wait_listed
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ITERATIONS = 8
LEARNING = ("iteration", "policy_version", "staleness_max", "reward_mean", "loss", "grad_norm", "eval_accuracy",
            "turns_mean", "tool_call_frac", "tool_errors", "response_length_mean")


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
    assert evals[0] <= 0.2 and evals[-1] >= 0.8, evals  # held-out greedy: the product through the calculator
    calls = [r["tool_call_frac"] for r in rows if r["iteration"] < ITERATIONS]
    assert calls[-1] > calls[0] + 0.3, calls  # the policy learnt to call where a call pays off
    assert max(r["staleness_max"] for r in rows if r["iteration"] < ITERATIONS) == 1.0
    for r in rows[:ITERATIONS]:
        assert r["turns_mean"] >= 1.0 and r["env_errors"] == 0
        assert r["mismatch_abs_logp_max"] is None or r["mismatch_abs_logp_max"] < 1e-3
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


@pytest.mark.e2e
def test_sigkill_mid_training_then_resume_is_exact_with_episodes(reference, tiny_tools_model, tmp_path):
    cfg = _config(tiny_tools_model, tmp_path, "cut")
    store = RunStore(str(tmp_path), "cut")
    proc, log = start_cli(cfg, tmp_path, "first")
    wait_listed(store, 5, "scored.parquet", proc, log)
    kill_tree(proc)
    committed = checkpoint.latest(store)
    assert committed is not None and committed.iteration in (1, 3), committed
    text = run_cli_to_end(cfg, tmp_path, "resumed")
    assert f"resuming cut from {committed.name}" in text, text
    a = load_file(str(reference / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == [], "final weights differ from the uninterrupted run"
    pick = lambda rows: [{k: r.get(k) for k in LEARNING} for r in rows]  # noqa: E731
    assert pick(_rows(tmp_path, "cut")) == pick(_rows(reference, "ref"))
