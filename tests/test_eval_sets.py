"""Named eval sets on the real stack: two sets with different reward types (boxed math and sandboxed code) in one
training run, their per-set metrics and responses; then `grpo eval` on the run's trained `final/` and on a
checkpoint, which must reproduce the run's own final evaluation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from grpo_core.run.storage import RunStore
from tasks.metric_columns import undocumented
from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.usefixtures("jail_shared")]

RUN = "eval-sets-test"
SETS = {
    "arith": {"path": str(REPO / "data/arith/eval.jsonl"), "max_prompts": 12, "samples": 4, "pass_k": [1, 2, 4]},
    # The arithmetic policy answers code prompts with a box, not a program: the code scorer must say so per row.
    "code": {"path": str(REPO / "data/code/eval.jsonl"), "reward_type": "code", "system_prompt": "",
             "max_prompts": 4, "greedy": True},
}


@pytest.fixture(scope="module")
def run_with_two_sets(tiny_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(tiny_model, str(root), run_name=RUN, eval={"interval": 1, "datasets": SETS},
                      data__eval_path=None, checkpoint={"interval": 1, "keep_last": 0})
    result = grpo_train(config=cfg)
    return result, cfg, RunStore(str(root), RUN), Path(root) / RUN


def test_each_set_has_its_metrics_and_rows_scored_with_its_reward_type(run_with_two_sets):
    result, _, store, run_dir = run_with_two_sets
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["eval_accuracy"] == r["eval/arith/accuracy"]  # the first set's greedy accuracy
        assert r["eval/arith/prompts"] == 12 and r["eval/code/prompts"] == 4
        assert 0.0 <= r["eval/arith/pass@1"] <= r["eval/arith/pass@2"] <= r["eval/arith/pass@4"] <= 1.0
        assert r["eval/code/accuracy"] == 0.0 and r.get("eval/code/pass@1") is None  # greedy only
    assert result["final_eval_accuracy"] == rows[-1]["eval/arith/accuracy"]
    assert undocumented(rows[0]) == []  # the metrics reference describes every eval column
    for it in (0, 2):
        arith = pq.read_table(run_dir / f"iter-{it:06d}" / "eval-arith.parquet")
        modes = arith.column("eval_mode").to_pylist()
        assert modes.count("greedy") == 12 and modes.count("sampled") == 12 * 4
        assert "gt_answer" in arith.column_names and set(arith.column("accuracy").to_pylist()) <= {0.0, 1.0}
        code = pq.read_table(run_dir / f"iter-{it:06d}" / "eval-code.parquet")
        assert code.num_rows == 4 and "test_cases" in code.column_names
        assert all("no ```python block" in e for e in code.column("reward_error").to_pylist())
        manifest = json.loads((run_dir / f"iter-{it:06d}" / "MANIFEST.json").read_text())
        assert {"eval-arith.parquet", "eval-code.parquet"} <= set(manifest["files"])


def _grpo_eval(args: list[str], cfg: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "grpo_cli.main", "eval", "--config", str(config), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def test_grpo_eval_on_final_reproduces_the_runs_last_evaluation(run_with_two_sets, tmp_path):
    _, cfg, store, run_dir = run_with_two_sets
    last = store.read_metrics().to_pylist()[-1]
    out = tmp_path / "out"
    done = _grpo_eval(["--run", RUN, "--out", str(out)], cfg, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "policy version 2" in done.stdout and "pass@4" in done.stdout
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    # same weights, prompts and scoring: greedy answers are the same as the run's final evaluation
    assert metrics["eval/arith/accuracy"] == last["eval/arith/accuracy"]
    assert metrics["eval/code/accuracy"] == 0.0
    greedy_run = pq.read_table(run_dir / "iter-000002" / "eval-arith.parquet")
    greedy_run = greedy_run.filter(greedy_run.column("eval_mode").to_numpy() == "greedy")
    greedy_eval = pq.read_table(out / "eval-arith.parquet")
    greedy_eval = greedy_eval.filter(greedy_eval.column("eval_mode").to_numpy() == "greedy")
    assert greedy_eval.column("response_text").to_pylist() == greedy_run.column("response_text").to_pylist()
    assert set(greedy_eval.column("policy_version").to_pylist()) == {2}


def test_grpo_eval_on_a_checkpoint_and_bad_arguments(run_with_two_sets, tmp_path, tiny_model, capsys):
    from grpo_cli.main import main as grpo

    _, cfg, _, _ = run_with_two_sets
    one = dict(cfg, eval={"interval": 1, "datasets": {"arith": dict(SETS["arith"], samples=0, pass_k=None)}})
    done = _grpo_eval(["--run", RUN, "--checkpoint", "iter-0", "--out", str(tmp_path / "c")], one, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "policy version 1" in done.stdout
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["rows"] == {"arith": 12}
    # The refusals come before any engine starts: the command's own function, in this process.
    config = str(tmp_path / "config.yaml")  # written by _grpo_eval above
    assert grpo(["eval", "--config", config, "--run", RUN, "--checkpoint", "iter-7"]) == 2
    assert "no committed checkpoint of iteration 7" in capsys.readouterr().err
    assert grpo(["eval", "--config", config, "--model", str(tmp_path / "nothing")]) == 2
    assert "not an HF model folder" in capsys.readouterr().err


def test_a_run_given_as_a_path_is_refused_with_the_name_and_root_to_use():
    from contextlib import ExitStack

    from grpo_core.lifecycle.offline_eval import EvalError, resolve_policy

    with ExitStack() as stack, pytest.raises(EvalError, match=r"--run 'runs/tc-c'.*try --run tc-c --root runs"):
        resolve_policy(stack, run="runs/tc-c")
