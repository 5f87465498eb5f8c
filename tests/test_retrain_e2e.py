"""Scheduled retraining with its gate, three nights of the tiny policy through whole flow runs (what `make
run-retrain` shows): night 1 is the first champion, night 2 (a learning rate that collapses the policy) is refused
against it, night 3 (from the champion, with a new day's data file) is promoted. Each night starts from the
champion of the moment (model.init_from=champion); the decisions are in gate.json, the Prefect artifact and the
MLflow registry alike, and the champion's lineage walks back through night 1 to the built model.

The gates run vLLM in this test process (the flow's process): after the in-process-engines group, never before it
on the same worker, since that group holds the real model's tests and is handed out first (tests/conftest.py)."""
from __future__ import annotations

import json
from contextlib import ExitStack
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _gate_artifact(run: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{run}-gate"])))
    assert len(found) == 1, found
    return found[0].data


def test_three_nights_promote_refuse_promote_through_the_gate(tiny_model, tmp_path, prefect_harness):
    from flows.grpo_train import grpo_train
    from grpo_core.config import RegistryConfig
    from grpo_core.lifecycle.lineage import walk
    from grpo_core.lifecycle.registry import open_registry
    from grpo_core.lifecycle.registry.commands import champion_policy

    rows = (REPO / "data/arith/train.jsonl").read_text().splitlines(keepends=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "day-1.jsonl").write_text("".join(rows[:400]))
    common = [f"storage.root={tmp_path}", f"model.path={tiny_model}", "model.init_from=champion",
              f"data.train_path={data}/day-*.jsonl", f"data.eval_path={REPO}/data/arith/eval.jsonl",
              "eval.interval=0", "checkpoint.interval=0", "gate.margin=0.02"]
    nights = {"night-1": ["iterations=4"], "night-2": ["iterations=3", "train.lr=0.3"], "night-3": ["iterations=8"]}
    gates = {}
    for name, overrides in nights.items():
        if name == "night-3":
            (data / "day-2.jsonl").write_text("".join(rows[400:]))
        result = grpo_train(config_path=str(REPO / "configs/tiny.yaml"),
                            overrides=[*common, f"run_name={name}", *overrides])
        gates[name] = json.loads((tmp_path / name / "gate.json").read_text())
        assert result["gate"] == gates[name]
        assert gates[name]["reason"] in _gate_artifact(name)
    one, two, three = gates.values()
    assert (one["outcome"], one["version"], one["compared_with"]) == ("promoted", 1, None)
    assert (two["outcome"], two["version"], two["compared_with"]) == ("refused", 2, 1)
    assert (three["outcome"], three["version"], three["compared_with"]) == ("promoted", 3, 1)
    # The champion is evaluated afresh by each night on the same prompts and seeds: the same figures each time.
    assert two["champion"] == three["champion"] == one["challenger"]
    assert two["challenger"]["eval/default/accuracy"] < 0.1 < one["challenger"]["eval/default/accuracy"]
    for name, version in (("night-1", None), ("night-2", 1), ("night-3", 1)):
        assert json.loads((tmp_path / name / "init_from.json").read_text()).get("registry_version") == version

    registry = open_registry(RegistryConfig(), str(tmp_path))
    assert [(v.version, v.run, v.decision) for v in registry.versions()] == \
        [(1, "night-1", "promoted"), (2, "night-2", "refused"), (3, "night-3", "promoted")]
    assert registry.champion().run == "night-3"
    chain = walk(registry.versions(), 3)
    assert [link.get("version") for link in chain] == [3, 1, None] and chain[-1] == {"model": tiny_model}
    assert sorted(d["path"].rsplit("/", 1)[-1] for d in chain[0]["data"] if d["role"] == "train") == \
        ["day-1.jsonl", "day-2.jsonl"]
    assert [d["path"].rsplit("/", 1)[-1] for d in chain[1]["data"] if d["role"] == "train"] == ["day-1.jsonl"]
    with ExitStack() as stack:  # what `grpo serve --model champion` serves
        folder, described = champion_policy(stack, SimpleNamespace(root=str(tmp_path), kind="mlflow", uri=None,
                                                                   name="grpo-policy", storage_options=None))
    assert folder == str(tmp_path / "night-3" / "final") and "version 3" in described
