"""The model registry (MLflow's and the folder kind behind one interface), the eval gate's decision, promotion with
its faults (a registry that cannot be reached, two runs finishing at once), lineage, and `grpo registry`.

The gate's evaluations are given here as figures (the evaluation itself is `grpo eval`'s code, checked in
test_offline_eval; the whole path with real policies runs in test_retrain_e2e): what these tests check is what the
registry and the gate do with them."""
from __future__ import annotations

import io
import json
import os
import socket
import threading
from contextlib import redirect_stderr, redirect_stdout

import pytest

from grpo_core.lifecycle import lineage
from grpo_cli.commands import main as grpo
from grpo_core.config import ConfigError, GateConfig, RegistryConfig, load_config
from grpo_core.lifecycle.gate import decide
from grpo_core.lifecycle.promotion import GATE, run_gate
from grpo_core.lifecycle.registry import ModelVersion, RegistryError, RegistryUnavailable, open_registry
from grpo_core.run.storage import RunStore

KINDS = ["mlflow", "folder"]


def _cfg(root, kind: str, run: str, **gate):
    sets = ["gate.margin=0.02"] + [f"gate.{k}={v}" for k, v in gate.items()]
    return load_config("configs/tiny.yaml", [f"storage.root={root}", f"registry.kind={kind}", f"run_name={run}",
                                             *sets])


def _finished_run(cfg, parent: dict | None = None, data: str = "data/arith/train.jsonl") -> RunStore:
    """A run folder as a finished run leaves it, as far as the gate reads it (no weights: evaluations are given)."""
    store = RunStore(cfg.storage.root, cfg.run_name)
    store.write_config(cfg.recorded())
    store.put_json_file("final/MANIFEST.json", {"policy_version": 40})
    store.put_json_file(lineage.INIT_FROM, parent or {"spec": None})
    lineage.record_inputs(store, {"train": [data]}, None)
    return store


def _figures(accuracy: dict[str, float]):
    """An evaluation that gives each run's policy the accuracy listed for it."""
    calls = []

    def evaluate(cfg, run, root):
        calls.append(run)
        return {"eval/default/prompts": 96.0, "eval/default/accuracy": accuracy[run], "eval/default/unscored": 0.0}
    evaluate.calls = calls
    return evaluate


def _show(root, *args) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert grpo(["registry", *args, "--root", str(root)]) == 0
    return json.loads(out.getvalue())


def test_the_gate_promotes_on_the_margin_and_keeps_the_guards():
    gate = GateConfig(margin=0.05, guards={"pass@8": 0.02}, metric="accuracy")
    first = decide(gate, {"accuracy": 0.3, "pass@8": 0.5}, None)
    assert first.promote and first.reason.startswith("first champion")
    assert not decide(GateConfig(min_value=0.5), {"accuracy": 0.3}, None).promote
    champion = {"accuracy": 0.50, "pass@8": 0.80}
    assert decide(gate, {"accuracy": 0.56, "pass@8": 0.79}, champion).promote
    short = decide(gate, {"accuracy": 0.54, "pass@8": 0.90}, champion)
    assert not short.promote and "below the margin 0.0500" in short.reason
    guarded = decide(gate, {"accuracy": 0.70, "pass@8": 0.70}, champion)
    assert not guarded.promote and "pass@8 0.7000 against 0.8000" in guarded.reason
    assert not decide(gate, {"accuracy": float("nan"), "pass@8": 0.9}, champion).promote


def test_the_gate_config_names_what_it_cannot_read(tmp_path):
    with pytest.raises(ConfigError, match=r"gate.sets names \['nope'\]"):
        load_config("configs/tiny.yaml", ["gate.sets=[nope]"])
    with pytest.raises(ConfigError, match=r"gate reads \['pass@4'\] of eval set 'default'"):
        load_config("configs/tiny.yaml", ["gate.guards={pass@4: 0.1}"])
    with pytest.raises(ConfigError, match="registry.kind=mlflow keeps its SQLite store under storage.root"):
        load_config("configs/tiny.yaml", ["storage.root=s3://bucket/runs", "gate.margin=0"])
    with pytest.raises(ConfigError, match="registry.kind=mlflow keeps its SQLite store under storage.root"):
        load_config("configs/tiny.yaml", ["storage.root=s3://bucket/runs", "model.init_from=champion"])
    assert load_config("configs/tiny.yaml", ["storage.root=s3://bucket/runs", "registry.kind=folder",
                                             "gate.margin=0"]).gate is not None
    assert load_config("configs/tiny.yaml", ["storage.root=s3://bucket/runs"]).gate is None  # no registry used


@pytest.mark.parametrize("kind", KINDS)
def test_three_rounds_promote_refuse_promote_and_the_lineage_walks_back(tmp_path, kind):
    evaluate = _figures({"night-1": 0.40, "night-2": 0.05, "night-3": 0.60})
    one = run_gate(_cfg(tmp_path, kind, "night-1"), _finished_run(_cfg(tmp_path, kind, "night-1")), evaluate)
    assert (one.outcome, one.version, one.compared_with) == ("promoted", 1, None)
    champion_spec = lineage.resolve("champion", str(tmp_path), None, "night-2", RegistryConfig(kind=kind))
    assert (champion_spec.run, champion_spec.folder, champion_spec.registry_version) == ("night-1", "final", 1)
    parent = {**champion_spec.to_json()}
    two = run_gate(_cfg(tmp_path, kind, "night-2"), _finished_run(_cfg(tmp_path, kind, "night-2"), parent),
                   evaluate)
    assert (two.outcome, two.version, two.compared_with) == ("refused", 2, 1)
    assert "0.0500 against the champion's 0.4000" in two.reason
    assert two.champion == {"eval/default/prompts": 96.0, "eval/default/accuracy": 0.40, "eval/default/unscored": 0.0}
    three = run_gate(_cfg(tmp_path, kind, "night-3"),
                     _finished_run(_cfg(tmp_path, kind, "night-3"), parent, data="data/arith/eval.jsonl"), evaluate)
    assert (three.outcome, three.version, three.compared_with) == ("promoted", 3, 1)
    assert evaluate.calls == ["night-1", "night-2", "night-1", "night-3", "night-1"]
    assert json.loads((tmp_path / "night-2" / GATE).read_text())["outcome"] == "refused"

    shown = _show(tmp_path, "show", "--kind", kind)
    assert shown["champion"]["version"] == 3 and shown["champion"]["run"] == "night-3"
    assert [(v["version"], v["run"], v["decision"]) for v in shown["versions"]] == \
        [(1, "night-1", "promoted"), (2, "night-2", "refused"), (3, "night-3", "promoted")]
    assert shown["versions"][1]["metrics"]["accuracy"] == 0.05
    assert [(e["action"], e["champion_before"], e["champion_after"]) for e in shown["events"]] == \
        [("promoted", None, 1), ("refused", 1, 1), ("promoted", 1, 3)]

    walked = _show(tmp_path, "show", "--kind", kind, "--lineage", "3")["lineage"]
    assert [link.get("version") for link in walked] == [3, 1, None]
    assert walked[-1] == {"model": "models/tiny"}
    assert walked[0]["parent"]["kind"] == "registry" and walked[0]["parent"]["registry_version"] == 1
    assert [d["path"] for d in walked[0]["data"]] == ["data/arith/eval.jsonl"]
    assert [d["path"] for d in walked[1]["data"]] == ["data/arith/train.jsonl"]
    assert walked[1]["data"][0]["size"] == os.path.getsize("data/arith/train.jsonl")
    assert len(walked[1]["data"][0]["sha256"]) == 64 and len(walked[0]["code"]["commit"]) == 40
    assert walked[0]["config_sha256"] != walked[1]["config_sha256"]  # run_name differs


@pytest.mark.parametrize("kind", KINDS)
def test_a_person_promotes_and_rolls_back(tmp_path, kind):
    evaluate = _figures({"a": 0.40, "b": 0.50, "c": 0.45})
    for run in "abc":
        run_gate(_cfg(tmp_path, kind, run), _finished_run(_cfg(tmp_path, kind, run)), evaluate)
    assert _show(tmp_path, "show", "--kind", kind)["champion"]["version"] == 2
    moved = _show(tmp_path, "promote", "3", "--kind", kind, "--reason", "c reads better")
    assert (moved["champion_before"], moved["champion"]["version"]) == (2, 3)
    back = _show(tmp_path, "rollback", "--kind", kind, "--reason", "complaints about c")
    assert (back["champion_before"], back["champion"]["version"]) == (3, 2)
    events = _show(tmp_path, "show", "--kind", kind)["events"]
    assert [(e["action"], e["champion_after"]) for e in events][-2:] == [("promote", 3), ("rollback", 2)]
    assert events[-1]["reason"] == "complaints about c" and events[-1]["by"].startswith("person (")
    err = io.StringIO()
    with redirect_stderr(err):
        assert grpo(["registry", "promote", "9", "--kind", kind, "--root", str(tmp_path), "--reason", "x"]) == 2
    assert "has no version 9 (versions: 1, 2, 3)" in err.getvalue()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_registry_ends_the_gate_unpromoted_with_the_policy_kept(tmp_path):
    cfg = load_config("configs/tiny.yaml", [f"storage.root={tmp_path}", "run_name=night", "gate.margin=0",
                                            f"registry.uri=http://127.0.0.1:{_closed_port()}", "registry.timeout_s=2"])
    store = _finished_run(cfg)
    outcome = run_gate(cfg, store, _figures({"night": 0.5}))
    assert outcome.outcome == "registry_unavailable" and outcome.version is None
    assert outcome.reason.startswith("not promoted: registry unavailable (MLflow registry http://127.0.0.1:")
    assert json.loads((tmp_path / "night" / GATE).read_text())["outcome"] == "registry_unavailable"
    assert (tmp_path / "night" / "final" / "MANIFEST.json").exists()


def test_a_registry_lost_while_the_champion_is_evaluated_changes_nothing(tmp_path):
    """The folder registry's document is replaced by something unwritable while the gate evaluates the champion:
    the gate ends unavailable, and once the folder is back the registry is exactly as before."""
    evaluate = _figures({"one": 0.4, "two": 0.6})
    run_gate(_cfg(tmp_path, "folder", "one"), _finished_run(_cfg(tmp_path, "folder", "one")), evaluate)
    document = tmp_path / "registry" / "registry.json"
    before = document.read_bytes()

    def lose_the_registry(cfg, run, root):
        if run == "one":  # the champion's evaluation: the registry goes away meanwhile
            document.rename(tmp_path / "aside.json")
            (tmp_path / "registry").rename(tmp_path / "registry-aside")
            (tmp_path / "registry").write_text("not a folder")
        return evaluate(cfg, run, root)
    outcome = run_gate(_cfg(tmp_path, "folder", "two"), _finished_run(_cfg(tmp_path, "folder", "two")),
                       lose_the_registry)
    assert outcome.outcome == "registry_unavailable" and "not promoted: registry unavailable" in outcome.reason
    (tmp_path / "registry").unlink()
    (tmp_path / "registry-aside").rename(tmp_path / "registry")
    (tmp_path / "aside.json").rename(document)
    assert document.read_bytes() == before
    # Gating the same run again (what re-running a finished run does) retries: its figures are not evaluated again.
    again = run_gate(_cfg(tmp_path, "folder", "two"), RunStore(str(tmp_path), "two"), evaluate)
    assert (again.outcome, again.version) == ("promoted", 2)
    assert evaluate.calls.count("two") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_gate_retried_after_its_commit_landed_registers_nothing_twice(tmp_path, kind):
    """The store was lost right after the gate's commit (the gate ended registry_unavailable, the version is in):
    the retry finds this run's policy registered and reports that version instead of recording it again."""
    evaluate = _figures({"night": 0.5})
    cfg = _cfg(tmp_path, kind, "night")
    store = _finished_run(cfg)
    first = run_gate(cfg, store, evaluate)
    store.put_json_file(GATE, {**json.loads((tmp_path / "night" / GATE).read_text()),
                               "outcome": "registry_unavailable"})  # what the lost reply left
    again = run_gate(cfg, RunStore(str(tmp_path), "night"), evaluate)
    assert (again.outcome, again.version) == (first.outcome, first.version) == ("promoted", 1)
    assert "recorded as version 1 by an earlier attempt of this gate" in again.reason
    shown = _show(tmp_path, "show", "--kind", kind)
    assert [v["version"] for v in shown["versions"]] == [1] and shown["champion"]["version"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_figure_nothing_measured_is_refused_and_recorded_as_null(tmp_path, kind):
    """An evaluation whose accuracy is NaN (nothing could be scored), first with no champion, then against one: the
    gate refuses it and registers the refusal whole, the figure stored as null (strict JSON has no NaN), gate.json
    written, `grpo registry show` JSON; a challenger's NaN guard figure is refused too, never a promotion."""
    nan = float("nan")
    first = run_gate(_cfg(tmp_path, kind, "empty"), _finished_run(_cfg(tmp_path, kind, "empty")),
                     _figures({"empty": nan}))
    assert (first.outcome, first.version) == ("refused", 1) and "nothing measured" in first.reason, first.reason
    assert json.loads((tmp_path / "empty" / GATE).read_text())["challenger"]["eval/default/accuracy"] is None
    run_gate(_cfg(tmp_path, kind, "good"), _finished_run(_cfg(tmp_path, kind, "good")), _figures({"good": 0.5}))
    second = run_gate(_cfg(tmp_path, kind, "empty-2"), _finished_run(_cfg(tmp_path, kind, "empty-2")),
                      _figures({"empty-2": nan, "good": 0.5}))
    assert (second.outcome, second.compared_with) == ("refused", 2) and "is nan" in second.reason, second.reason
    shown = _show(tmp_path, "show", "--kind", kind)
    assert [v["decision"] for v in shown["versions"]] == ["refused", "promoted", "refused"]
    assert [v["metrics"]["eval/default/accuracy"] for v in shown["versions"]] == [None, 0.5, None]
    assert shown["champion"]["version"] == 2


@pytest.mark.parametrize("kind", KINDS)
def test_two_runs_finishing_at_once_promote_one_at_a_time(tmp_path, kind):
    """Run A holds the registry while it evaluates the champion; run B, better than the old champion but not than
    A, finishes meanwhile, waits, and is compared against A (the new champion): refused, saying why."""
    evaluate = _figures({"old": 0.40, "a": 0.70, "b": 0.60})
    run_gate(_cfg(tmp_path, kind, "old"), _finished_run(_cfg(tmp_path, kind, "old")), evaluate)
    b_cfg = _cfg(tmp_path, kind, "b")
    b_store = _finished_run(b_cfg)
    b_waits, results = threading.Event(), {}
    b_thread = threading.Thread(target=lambda: results.update(b=run_gate(
        b_cfg, b_store, evaluate, log=lambda line: b_waits.set() if "waiting for it" in line else None)))

    def a_evaluates(cfg, run, root):
        if run == "old":  # A holds the lock now: B finishes its own evaluation and waits for A
            b_thread.start()
            assert b_waits.wait(120)
        return evaluate(cfg, run, root)
    results["a"] = run_gate(_cfg(tmp_path, kind, "a"), _finished_run(_cfg(tmp_path, kind, "a")), a_evaluates)
    b_thread.join(120)
    a, b = results["a"], results["b"]
    assert (a.outcome, a.version, a.compared_with) == ("promoted", 2, 1)
    assert (b.outcome, b.version, b.compared_with) == ("refused", 3, 2)
    assert "the champion changed from version 1 (run old) to version 2 (run a)" in b.reason
    assert "0.6000 against the champion's 0.7000" in b.reason
    assert open_registry(RegistryConfig(kind=kind), str(tmp_path)).champion().run == "a"


def test_init_from_champion_without_one_starts_from_model_path(tmp_path):
    source = lineage.resolve("champion", str(tmp_path), None, "first", RegistryConfig(kind="folder"))
    assert source.folder is None and "no champion yet" in lineage.describe(source)


def test_a_version_names_what_is_missing(tmp_path):
    registry = open_registry(RegistryConfig(kind="folder"), str(tmp_path))
    with pytest.raises(RegistryError, match="has no version 4"):
        registry.set_champion(4, "promote", "person (x)", "why")
    version = ModelVersion("r", str(tmp_path), "p", 1, "refused", "no", {}, {})
    registry.record(version, "gate")
    assert registry.champion() is None and [v.version for v in registry.versions()] == [1]
    with pytest.raises(RegistryUnavailable, match="registers model 'grpo-policy', not 'other'"):
        open_registry(RegistryConfig(kind="folder", name="other"), str(tmp_path)).versions()


def test_the_decision_artifact_shows_both_sides_and_the_guards(tmp_path):
    from tasks.gate import gate_markdown

    evaluate = _figures({"one": 0.5, "two": 0.3})
    cfg = _cfg(tmp_path, "folder", "one", guards="{accuracy: 0.5}")
    run_gate(cfg, _finished_run(cfg), evaluate)
    cfg = _cfg(tmp_path, "folder", "two", guards="{accuracy: 0.5}")
    outcome = run_gate(cfg, _finished_run(cfg), evaluate)
    md = gate_markdown(outcome)
    assert md.startswith("# Gate: REFUSED\n\nrefused: accuracy 0.3000 against the champion's 0.5000")
    assert "| eval/default/accuracy | 0.3000 | 0.5000 |" in md and "| eval/default/prompts | 96 | 96 |" in md
    assert "- registered as version **2**" in md and "guard `accuracy`: 0.3000 against 0.5000" in md


def test_serve_champion_resolves_the_champions_policy_and_serves_it_under_the_models_name(tmp_path, monkeypatch):
    import grpo_cli.commands as cli

    served = []
    monkeypatch.setattr(cli, "_serve", lambda args, model, extra: served.append((model, args.served_model_name)))
    err = io.StringIO()
    with redirect_stderr(err):
        assert grpo(["serve", "--model", "champion", "--root", str(tmp_path), "--kind", "folder"]) == 2
    assert "has no champion yet" in err.getvalue() and not served
    cfg = _cfg(tmp_path, "folder", "night")
    run_gate(cfg, _finished_run(cfg), _figures({"night": 0.5}))
    with redirect_stdout(io.StringIO()):
        assert grpo(["serve", "--model", "champion", "--root", str(tmp_path), "--kind", "folder"]) == 0
    assert served == [(str(tmp_path / "night" / "final"), "grpo-policy")]


def test_a_run_started_before_lineage_was_recorded_gets_its_record_at_registration(tmp_path):
    from grpo_core.data.files import recorded_or_resolved

    cfg = _cfg(tmp_path, "folder", "old")
    store = _finished_run(cfg)
    store.delete(lineage.INPUTS)
    recorded_or_resolved(store, {"train": "data/arith/train.jsonl"})
    run_gate(cfg, store, _figures({"old": 0.5}))
    data = open_registry(RegistryConfig(kind="folder"), str(tmp_path)).champion().lineage["data"]
    assert [(d["role"], d["path"], d["size"]) for d in data] == \
        [("train", "data/arith/train.jsonl", os.path.getsize("data/arith/train.jsonl"))]
