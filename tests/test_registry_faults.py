"""The model registry under faults (issue 53, "no request takes a run down"): a record, promotion or rollback happens
whole or not at all whichever step of it fails, for both kinds; a store that is not a registry (an emptied or corrupt
mlflow.db, a tag or a registry.json that does not parse) is an error naming it, never a new empty registry; every
refusal of `grpo registry` / `grpo serve --model champion` is one line on stderr, rc 2, and JSON output stays JSON.

Faults are injected into the real stores' calls: every public method of MLflow's client (the SQLite store behind it
is real), or the folder kind's fsync and rename of its one document. Each call an operation makes is failed in turn,
four ways: it fails and the store answers again; it lands and then reports a failure (a reply lost), the store
answering again; and both of those with the store gone for every call after it."""
from __future__ import annotations

import errno
import inspect
import io
import json
import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpo_cli.commands import main as grpo
from grpo_core.config import RegistryConfig
from grpo_core.lifecycle.promotion import run_gate
from grpo_core.lifecycle.registry import ModelVersion, RegistryCorrupt, RegistryUnavailable, open_registry, registry_uri
from tests.test_registry import _cfg, _figures, _finished_run

KINDS = ["mlflow", "folder"]


def _version(run: str, decision: str) -> ModelVersion:
    return ModelVersion(run, "/runs", f"/runs/{run}/final", 40, decision, f"{run}: {decision}", {"accuracy": 0.5},
                        {"parent": {"model": "m"}})


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> dict[str, Path]:
    """Per kind, a storage root whose registry holds a (promoted), b (promoted), c (refused): champion 2, after 1.
    Made once (MLflow's first database takes seconds); each test copies it."""
    roots = {}
    for kind in KINDS:
        root = tmp_path_factory.mktemp(f"seed-{kind}")
        registry = open_registry(RegistryConfig(kind=kind), str(root))
        for run, decision in (("a", "promoted"), ("b", "promoted"), ("c", "refused")):
            registry.record(_version(run, decision), f"gate (run {run})")
        roots[kind] = root
    return roots


def _copy(seed: Path, root: Path) -> Path:
    shutil.copytree(seed / "registry", root / "registry", ignore=shutil.ignore_patterns(".promotion.lock"))
    return root


def _read(kind: str, root: Path) -> tuple:
    """The registry as a reader sees it: champion, versions, events."""
    registry = open_registry(RegistryConfig(kind=kind), str(root))
    champion = registry.champion()
    return (champion.to_json() if champion else None, [v.to_json() for v in registry.versions()],
            [e.to_json() for e in registry.events()])


def _untimed(state: tuple) -> tuple:
    """A state without its timestamps, to compare with the same change made at another second."""
    champion, versions, events = state
    drop = ("registered_at", "at")
    return ({k: v for k, v in champion.items() if k not in drop} if champion else None,
            [{k: v for k, v in x.items() if k not in drop} for x in versions],
            [{k: v for k, v in x.items() if k not in drop} for x in events])


def _alias(root: Path) -> int | None:
    """Where MLflow's own `champion` alias points (what its UI and models:/NAME@champion show)."""
    from mlflow import MlflowClient

    uri = registry_uri(RegistryConfig(), str(root))
    aliases = MlflowClient(tracking_uri=uri, registry_uri=uri).get_registered_model("grpo-policy").aliases
    return int(aliases["champion"]) if "champion" in aliases else None


@dataclass(frozen=True)
class Mode:
    name: str
    lands: bool  # the call does its work, then reports a failure
    gone: bool   # every later call fails too (until the test reads the registry back)


MODES = [Mode("fails", False, False), Mode("lands-then-fails", True, False), Mode("fails-store-gone", False, True),
         Mode("lands-store-gone", True, True)]


class StoreFaults:
    """Wraps the calls a registry kind makes to its store: records them (outermost calls only), or fails one of them
    in a `Mode`. MLflow: every public method of its client; folder: the fsync and the rename that write the
    document."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: str):
        self.calls: list[str] = []
        self.active, self.depth, self.gone = False, 0, False
        self.fault: tuple[int, Mode] | None = None
        if kind == "mlflow":
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException

            self.error = lambda what: MlflowException(f"injected fault at {what}: the store did not answer")
            for name in dir(MlflowClient):
                if not name.startswith("_") and inspect.isfunction(inspect.getattr_static(MlflowClient, name)):
                    monkeypatch.setattr(MlflowClient, name, self._wrapped(name, getattr(MlflowClient, name)))
        else:
            self.error = lambda what: OSError(errno.EIO, f"injected fault at {what}: the disk did not answer")
            for name in ("fsync", "replace"):
                monkeypatch.setattr(os, name, self._wrapped(f"os.{name}", getattr(os, name)))

    def _wrapped(self, name: str, real):
        def call(*args, **kwargs):
            if not self.active or self.depth:
                return real(*args, **kwargs)
            index = len(self.calls)
            self.calls.append(name)
            self.depth += 1
            try:
                if self.gone:
                    raise self.error(name)
                if self.fault is not None and self.fault[0] == index:
                    mode = self.fault[1]
                    if mode.lands:
                        real(*args, **kwargs)
                    self.gone = mode.gone
                    raise self.error(f"{name} ({mode.name})")
                return real(*args, **kwargs)
            finally:
                self.depth -= 1
        return call

    @contextmanager
    def on(self, fault: tuple[int, Mode] | None = None):
        self.calls, self.fault, self.gone, self.active = [], fault, False, True
        try:
            yield
        finally:
            self.active, self.gone = False, False


OPS = {
    "record-promoted": lambda r: r.record(_version("d", "promoted"), "gate (run d)"),
    "record-refused": lambda r: r.record(_version("e", "refused"), "gate (run e)"),
    "promote": lambda r: r.set_champion(3, "promote", "person (t)", "c after all"),
    "rollback": lambda r: r.set_champion(1, "rollback", "person (t)", "back to a"),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_fault_at_any_step_leaves_the_registry_as_before_or_as_after(seeded, tmp_path, monkeypatch, kind, op):
    faults = StoreFaults(monkeypatch, kind)
    twin = _copy(seeded[kind], tmp_path / "twin")  # the same change, no fault: what "after" reads
    before = _read(kind, twin)
    twin_registry = open_registry(RegistryConfig(kind=kind), str(twin))
    with faults.on():
        OPS[op](twin_registry)
    steps = faults.calls
    after = _untimed(_read(kind, twin))
    assert after != _untimed(before)
    assert steps, "the change made no call to fail"
    ended = set()
    for index, step in enumerate(steps):
        for mode in MODES:
            root = _copy(seeded[kind], tmp_path / f"{index}-{mode.name}")
            registry = open_registry(RegistryConfig(kind=kind), str(root))
            with faults.on((index, mode)), pytest.raises(RegistryUnavailable) as raised:
                OPS[op](registry)
            assert "\n" not in str(raised.value)
            now = _read(kind, root)
            case = f"{op} with call {index} ({step}) faulted, {mode.name}: {raised.value}"
            assert now == before or _untimed(now) == after, f"between before and after: {case}"
            if kind == "mlflow" and not mode.gone:  # the store answered: undone, the alias with it
                assert now == before, f"not undone: {case}"
                assert _alias(root) == (before[0]["version"] if before[0] else None), case
            ended.add("before" if now == before else "after")
            if kind == "mlflow" and mode.gone:  # the next change puts MLflow's alias back in line with the history
                open_registry(RegistryConfig(kind=kind), str(root)).record(_version("f", "refused"), "gate (run f)")
                champion = _read(kind, root)[0]
                assert _alias(root) == (champion["version"] if champion else None), case
    # The faults that land at the commit point with the store gone commit the change whole; the others change nothing.
    assert ended == {"before", "after"}


def test_a_promotion_whose_alias_step_fails_is_undone_and_one_that_committed_can_be_rolled_back(
        seeded, tmp_path, monkeypatch):
    """`grpo registry promote` with MLflow's alias write failing: rc 2, one line, the champion and the events as they
    were. The alias write landing and the store going away after it: the promotion is whole (champion and event), so
    `rollback` finds the earlier champion."""
    faults = StoreFaults(monkeypatch, "mlflow")

    def promote(root: Path) -> CliResult:
        return _cli(["registry", "promote", "3", "--root", str(root), "--reason", "c after all"])
    with faults.on():
        assert promote(_copy(seeded["mlflow"], tmp_path / "recorded")).rc == 0
    alias_call = faults.calls.index("set_registered_model_alias")

    root = _copy(seeded["mlflow"], tmp_path / "undone")
    before = _read("mlflow", root)
    with faults.on((alias_call, MODES[0])):
        out = promote(root)
    assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert out.stderr.startswith("error: MLflow registry sqlite:///") and "set_registered_model_alias" in out.stderr
    assert "undone: the registry is as it was" in out.stderr
    assert _read("mlflow", root) == before and _alias(root) == 2

    root = _copy(seeded["mlflow"], tmp_path / "committed")
    with faults.on((alias_call, MODES[3])):
        out = promote(root)
    assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert "it may have been committed; `grpo registry show` says which" in out.stderr
    champion, _, events = _read("mlflow", root)
    assert champion["version"] == 3
    assert (events[-1]["action"], events[-1]["champion_before"], events[-1]["champion_after"]) == ("promote", 2, 3)
    back = _cli(["registry", "rollback", "--root", str(root), "--reason", "c was worse"])
    assert back.rc == 0, back
    assert json.loads(back.stdout)["champion"]["version"] == 2 and _alias(root) == 2


@dataclass(frozen=True)
class CliResult:
    rc: int
    stdout: str
    stderr: str


def _cli(args: list[str]) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = grpo(args)
    return CliResult(rc, out.getvalue(), err.getvalue())


def _sqlite_without_mlflow(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")


MLFLOW_DB_FAULTS = {
    "emptied": (lambda p: p.write_bytes(b""), "is empty (0 bytes), not an MLflow registry"),
    "garbage": (lambda p: p.write_bytes(b"this is no database\n" * 200), "is not an MLflow registry"),
    "another database": (lambda p: (p.unlink(), _sqlite_without_mlflow(p)),
                         "is a SQLite file but not an MLflow registry (no table registered_models"),
}


@pytest.mark.parametrize("fault", list(MLFLOW_DB_FAULTS))
def test_an_mlflow_db_that_is_no_registry_is_named_never_made_a_new_one(seeded, tmp_path, fault):
    root = _copy(seeded["mlflow"], tmp_path)
    db = root / "registry" / "mlflow.db"
    damage, says = MLFLOW_DB_FAULTS[fault]
    damage(db)
    damaged = db.read_bytes()
    out = _cli(["registry", "show", "--root", str(root)])
    assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert str(db) in out.stderr and says in out.stderr
    with pytest.raises(RegistryCorrupt, match="not an MLflow registry"):
        open_registry(RegistryConfig(), str(root))
    # A gate finding it promotes nothing, says why, and leaves the file as it found it.
    cfg = _cfg(root, "mlflow", "night")
    outcome = run_gate(cfg, _finished_run(cfg), _figures({"night": 0.9}), log=lambda _line: None)
    assert outcome.outcome == "registry_unavailable" and str(db) in outcome.reason and outcome.version is None
    assert db.read_bytes() == damaged


def _set_tag(root: Path, version: str | None, key: str, value: str) -> None:
    from mlflow import MlflowClient

    uri = registry_uri(RegistryConfig(), str(root))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    if version is None:
        client.set_registered_model_tag("grpo-policy", key, value)
    else:
        client.set_model_version_tag("grpo-policy", version, key, value)


MLFLOW_TAG_FAULTS = {
    "record not JSON": (("2", "grpo.record", "{not json"), "version 2's tag grpo.record"),
    "record missing fields": (("1", "grpo.record", '{"run": "a"}'), "root: Field required"),
    "event not JSON": ((None, "grpo.event.000002", "]"), "the registered model's tag grpo.event.000002"),
    "event of no action": ((None, "grpo.event.000003", '{"action": "won", "version": 3}'),
                           "action: Input should be 'promoted', 'refused', 'promote' or 'rollback'"),
}


@pytest.mark.parametrize("fault", list(MLFLOW_TAG_FAULTS))
def test_an_mlflow_tag_of_ours_that_does_not_parse_is_named(seeded, tmp_path, fault):
    root = _copy(seeded["mlflow"], tmp_path)
    (version, key, value), says = MLFLOW_TAG_FAULTS[fault]
    _set_tag(root, version, key, value)
    for args in (["show"], ["show", "--lineage", "2"], ["promote", "1", "--reason", "x"]):
        out = _cli(["registry", *args, "--root", str(root)])
        assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, (args, out)
        assert f"{root}/registry/mlflow.db" in out.stderr and says in out.stderr, (args, out)


def _document(seed: Path) -> dict:
    return json.loads((seed / "registry" / "registry.json").read_text())


REGISTRY_JSON_FAULTS = {
    "empty": (lambda d: "", "not valid JSON"),
    "not JSON": (lambda d: "{", "not valid JSON"),
    "a list": (lambda d: "[]", "a JSON list, not an object with name, champion, versions, events"),
    "an empty object": (lambda d: "{}", "no name, champion, versions, events"),
    "no events": (lambda d: json.dumps({k: v for k, v in d.items() if k != "events"}), "no events"),
    "a version without a run": (
        lambda d: json.dumps({**d, "versions": [{k: v for k, v in x.items() if k != "run"} for x in d["versions"]]}),
        "versions[0]: not a ModelVersion record (run: Field required)"),
    "a version without its time": (
        lambda d: json.dumps({**d, "versions": [{k: v for k, v in x.items() if k != "registered_at"}
                                                for x in d["versions"]]}), "registered_at: Field required"),
    "a champion that is no version": (lambda d: json.dumps({**d, "champion": 7}),
                                      "champion: 7 is none of its versions (1, 2, 3)"),
    "versions not a list": (lambda d: json.dumps({**d, "versions": {}}), "versions: a JSON dict, not a list"),
}


@pytest.mark.parametrize("fault", list(REGISTRY_JSON_FAULTS))
def test_a_registry_json_that_is_no_registry_is_named_never_read_as_empty(seeded, tmp_path, fault):
    root = _copy(seeded["folder"], tmp_path)
    document = root / "registry" / "registry.json"
    damage, says = REGISTRY_JSON_FAULTS[fault]
    document.write_text(damage(_document(seeded["folder"])))
    damaged = document.read_bytes()
    for args in (["show"], ["promote", "1", "--reason", "x"], ["rollback", "--reason", "x"]):
        out = _cli(["registry", *args, "--kind", "folder", "--root", str(root)])
        assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, (args, out)
        assert str(document) in out.stderr and says in out.stderr, (args, out)
    cfg = _cfg(root, "folder", "night")
    outcome = run_gate(cfg, _finished_run(cfg), _figures({"night": 0.9}), log=lambda _line: None)
    assert outcome.outcome == "registry_unavailable" and str(document) in outcome.reason
    assert document.read_bytes() == damaged


def test_no_registry_json_is_no_registry_yet(tmp_path):
    shown = _cli(["registry", "show", "--kind", "folder", "--root", str(tmp_path)])
    assert shown.rc == 0 and json.loads(shown.stdout)["versions"] == [] and not (tmp_path / "registry").exists()


def test_a_promotion_that_waits_for_the_lock_keeps_its_json_on_stdout(seeded, tmp_path):
    """Another holder has the promotion lock: `grpo registry promote` says it waits on stderr; stdout is its JSON."""
    root = _copy(seeded["folder"], tmp_path)
    holder = open_registry(RegistryConfig(kind="folder"), str(root))
    grpo_bin = os.path.join(os.path.dirname(sys.executable), "grpo")
    lines: queue.Queue[str] = queue.Queue()
    with holder.lock():
        proc = subprocess.Popen([grpo_bin, "registry", "promote", "1", "--kind", "folder", "--root", str(root),
                                 "--reason", "a again"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
        reader.start()
        seen = []
        while not any("waiting for it" in line for line in seen):
            seen.append(lines.get(timeout=120))
    stdout = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(10)
    while not lines.empty():
        seen.append(lines.get())
    assert proc.returncode == 0, seen
    assert json.loads(stdout)["champion"]["version"] == 1
    assert any("registry lock taken after" in line for line in seen)


def test_serving_a_champion_whose_run_folder_is_gone_says_so(tmp_path, monkeypatch):
    import grpo_cli.commands as cli

    served = []
    monkeypatch.setattr(cli, "_serve", lambda args, model, extra: served.append(model))
    cfg = _cfg(tmp_path, "folder", "night")
    run_gate(cfg, _finished_run(cfg), _figures({"night": 0.5}), log=lambda _line: None)
    shutil.rmtree(tmp_path / "night")
    out = _cli(["serve", "--model", "champion", "--root", str(tmp_path), "--kind", "folder"])
    assert out.rc == 2 and not served and len(out.stderr.splitlines()) == 1, out
    assert "the champion, version 1 (run night under" in out.stderr and "cannot be served" in out.stderr
    assert str(tmp_path / "night") in out.stderr


@pytest.mark.parametrize("options, says", [("{", "--storage-options: not JSON"),
                                           ("[1]", "--storage-options: a JSON object of fsspec options")])
def test_storage_options_that_are_no_options_are_one_line(tmp_path, options, says):
    out = _cli(["registry", "show", "--kind", "folder", "--root", str(tmp_path), "--storage-options", options])
    assert out.rc == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1 and says in out.stderr, out


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_run_from_the_champion_of_a_registry_that_is_no_registry_is_one_line(seeded, tmp_path, kind, tiny_model):
    """`grpo train` with model.init_from=champion reads the registry before Prefect or Ray start: a store that is not
    a registry is a one-line refusal naming it (it used to be a traceback from inside the flow run), nothing made."""
    import yaml

    from grpo_cli.main import main as grpo_train_cli
    from tests.conftest import tiny_config

    root = _copy(seeded[kind], tmp_path)
    store = Path(registry_uri(RegistryConfig(kind=kind), str(root)).removeprefix("sqlite:///"))
    if kind == "folder":
        store = store / "registry.json"
    store.write_bytes(b"")
    config = tmp_path / "night.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tiny_model, str(root), run_name="night", registry={"kind": kind},
                                                 model={"path": tiny_model, "init_from": "champion"})))
    err = io.StringIO()
    with redirect_stderr(err):
        rc = grpo_train_cli(["train", "--config", str(config)])
    assert rc == 2 and len(err.getvalue().splitlines()) == 1, err.getvalue()
    assert "model.init_from=champion" in err.getvalue() and str(store) in err.getvalue(), err.getvalue()
    assert not (root / "night").exists()
