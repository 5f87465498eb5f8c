"""Async RL (rollout.max_staleness >= 1) on the real stack with the tiny model, one run: the rollout of iteration k+s
runs while iteration k trains, every batch is trained on exactly min(k, s) iterations after the weights that sampled
it; an outside producer's groups taken from the inbox (and a bad file refused); `grpo scale` adding a sampler while
the run goes. An async run killed mid-training and resumed bit-identical: tests/test_multiturn_flow.py (split
placement, one iteration of staleness)."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_core.pipeline import inbox
from grpo_core.run.storage import RunStore
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ITERATIONS = 6
SHAPE = dict(iterations=ITERATIONS, rollout__prompts_per_iteration=4, rollout__samples_per_prompt=4,
             rollout__max_staleness=1, train__mini_batch_size=8, train__micro_batch_size=8, train__lr=1e-3,
             eval__interval=3, eval__max_prompts=8, checkpoint__interval=2, checkpoint__keep_last=2,
             cluster__placement="split", cluster__sampler_resources={"num_cpus": 0.5, "torch_threads": 1},
             cluster__learner_resources={"torch_threads": 1})  # the roles compute at once: a thread each


def _config(tiny_model: str, root: Path, run_name: str) -> dict:
    return tiny_config(tiny_model, str(root), run_name=run_name, **SHAPE)


def _rows(root: Path, run: str) -> list[dict]:
    return RunStore(str(root), run).read_metrics().to_pylist()


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory, prefect_harness):
    """The module's one run (split, one iteration of staleness, broadcast): an outside producer's two scored groups
    and a bad file wait in its inbox from the start, and `grpo scale ref --samplers 2` is asked once iteration 1 is
    recorded. Returns (the run folder's root, what `grpo scale` returned)."""
    import threading
    import time

    from flows.grpo_train import grpo_train
    from grpo_cli.commands import main as grpo_cli

    root = tmp_path_factory.mktemp("async-reference")
    store = RunStore(str(root), "ref")
    asked: list[int] = []

    def scale_after_iteration_1() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if 1 in store.read_metrics().column("iteration").to_pylist():
                    asked.append(grpo_cli(["scale", "ref", "--samplers", "2", "--root", str(root)]))
                    return
            except (OSError, KeyError):
                pass
            time.sleep(0.05)

    _put_inbox(store, "a-bad", _inbox_item(tiny_model, 1, version=0).drop_columns(["reward"]))
    _put_inbox(store, "b-env", _inbox_item(tiny_model, 2, version=0))
    threading.Thread(target=scale_after_iteration_1, daemon=True).start()
    grpo_train(config=_config(tiny_model, root, "ref"))
    return root, asked


def test_rollout_overlaps_training_and_staleness_is_bounded(reference):
    reference, _ = reference
    rows = [r for r in _rows(reference, "ref") if r["iteration"] < ITERATIONS]
    assert [r["staleness_max"] for r in rows] == [0.0] + [1.0] * (ITERATIONS - 1)
    steps = 2  # optimizer steps per iteration (2 mini-batches)
    assert [r["policy_version"] for r in rows] == [0, 0] + [steps * (k - 1) for k in range(2, ITERATIONS)]
    overlapped = [rows[k + 1]["rollout_started_at"] < rows[k]["train_ended_at"] for k in range(ITERATIONS - 1)]
    assert all(overlapped), [(r["rollout_started_at"], r["train_started_at"], r["train_ended_at"]) for r in rows]
    for r in rows:
        assert r["sync_logprob_max_diff"] < 1e-4, r
        assert r["offpolicy_weight_mean"] is not None  # a correction is on by default in async mode
    assert (reference / "ref" / "timeline.png").stat().st_size > 10_000


def _inbox_item(tiny_model: str, groups: int, version: int):
    """``groups`` scored groups as an outside producer would write them (the tiny model's tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = []
    for g in range(groups):
        prompt = tok.encode(f"What is {g} + 3?")
        for i in range(4):
            text = f"\\boxed{{{g + 3 + i % 2}}}"
            response = tok.encode(text) + [tok.eos_token_id]
            rows.append({"group_id": g, "sample_idx": i, "prompt_token_ids": prompt, "response_token_ids": response,
                         "sampler_logprobs": [-1.0] * len(response), "response_text": text, "finish_reason": "stop",
                         "truncated": False, "response_length": len(response), "policy_version": version,
                         "reward": float(i % 2 == 0)})
    return pa.Table.from_pylist(rows)


def _put_inbox(store: RunStore, name: str, table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put_bytes(f"inbox/{name}.parquet", buf.getvalue())
    store.put_bytes(f"inbox/{name}.ready", b"")


def test_a_running_async_flow_scales_out_and_takes_inbox_experience(reference):
    """The run's inbox held an outside producer's two scored groups and a bad file: the groups replace two of the
    first iteration's prompts and are trained on; the bad file is refused and kept with the field that is wrong.
    `grpo scale ref --samplers 2` while it goes: from the next iteration on two samplers draw rows, the new one having
    loaded the current weights first."""
    root, asked = reference
    store = RunStore(str(root), "ref")
    assert asked == [0]
    rows = [r for r in store.read_metrics().to_pylist() if r["iteration"] < ITERATIONS]
    counts = [r["samplers"] for r in rows]
    assert counts[:2] == [1, 1] and counts[-1] == 2 and counts == sorted(counts), counts
    first = counts.index(2)
    for r in rows:
        assert r["sync_logprob_max_diff_sampler0"] < 1e-4 and r["staleness_max"] <= 1, r
        if r["samplers"] == 2:
            assert r["sync_logprob_max_diff_sampler1"] < 1e-4, r  # the new sampler serves the learner's weights
    # The batch sampled while the iteration that scaled up trained is drawn by both samplers.
    assert set(store.get_table(first + 1, "rollouts.parquet").column("sampler_id").to_pylist()) == {0, 1}

    assert [r["inbox_groups"] for r in rows] == [2] + [0] * (ITERATIONS - 1)
    took = 0
    scored = store.get_table(took, "scored.parquet")
    assert scored.num_rows == 4 * 4 and store.get_table(took, "rollouts.parquet").num_rows == 2 * 4
    assert scored.column("sampler_id").to_pylist()[-8:] == [-1] * 8
    assert scored.column("group_id").to_pylist()[-8:] == [2] * 4 + [3] * 4
    assert store.entry(took, "train.json") is not None
    error = store.get_json_file("inbox/rejected/a-bad.error.json")
    assert error["field"] == "reward" and error["error"] == "column is missing"
    assert inbox.ready_items(store) == []
