"""Where a run's starting weights come from: ``model.init_from``, resolved once and recorded in the run folder.

Why: scheduled retraining ("every night, retrain from the newest policy on the newest data") needs a run to start
from another run's result without anyone editing a path. ``model.init_from`` names a run, a glob of runs under
``storage.root`` (``tiny-nightly-*``) or an HF folder; the run that starts picks the newest matching run that has a
policy (its ``final/``, else its latest committed checkpoint) and records the choice in ``init_from.json``. A
resume, or a Prefect retry of the same flow run, reads that record instead of resolving again, so the weights a run
started from never change under it (a newer run may have finished in the meantime).

``model.init_from: champion`` names the model registry's champion (``grpo_core.lifecycle.registry``): the run starts from
that version's policy and records the version, which is the parent in the lineage the registry keeps of every
version it registers (`version_lineage`: parent, data files with sizes and hashes, resolved config, code commit).

Nothing matching (the first run of a schedule, no champion yet) means ``model.path``'s weights, recorded as such.
"""
from __future__ import annotations

import fnmatch
import os
import subprocess
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import fsspec

from grpo_core.run import checkpoint
from grpo_core.config import CHAMPION
from grpo_core.data.files import DATA_FILES
from grpo_core.run.status import FINAL, FINAL_MANIFEST, read_status, run_names
from grpo_core.run.storage import RunStore

if TYPE_CHECKING:
    from grpo_core.config import RegistryConfig
    from grpo_core.lifecycle.registry import ModelVersion

INIT_FROM = "init_from.json"
TEACHER = "teacher.json"
INPUTS = "lineage_inputs.json"  # the data files' sizes and hashes and the code's commit, at the run's first start


class InitFromError(ValueError):
    """``model.init_from`` names something that cannot be started from; the message says what and why."""


@dataclass(frozen=True)
class InitSource:
    """The policy a run starts from. ``run`` None: ``model.path`` itself (or an HF folder given directly)."""

    spec: str | None             # model.init_from as configured
    run: str | None              # the run it resolved to
    folder: str | None           # run-relative folder of the policy (final or checkpoints/iter-N), or an HF path
    policy_version: int | None   # the source run's policy version at that folder
    finished_at: float | None    # when the source run last wrote its status
    registry_version: int | None = None  # init_from=champion: the registry version it was

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _champion(root: str, registry: "RegistryConfig | None", storage_options: dict | None) -> InitSource:
    from grpo_core.config import RegistryConfig
    from grpo_core.lifecycle.registry import RegistryUnavailable, open_registry

    try:
        champion = open_registry(registry or RegistryConfig(), root, storage_options).champion()
    except RegistryUnavailable as err:  # corrupt too: never read as "no champion yet", which would start over
        raise InitFromError(f"model.init_from=champion: the registry cannot be read: {err}") from err
    if champion is None:
        return InitSource(CHAMPION, None, None, None, None)
    if champion.root.rstrip("/") != root.rstrip("/"):
        raise InitFromError(f"model.init_from=champion: the champion (version {champion.version}, run "
                            f"{champion.run}) lives under {champion.root}, not this run's storage.root {root}")
    return InitSource(CHAMPION, champion.run, FINAL, champion.policy_version, None, champion.version)


def resolve(spec: str | None, root: str, storage_options: dict | None, this_run: str,
            registry: "RegistryConfig | None" = None) -> InitSource:
    """The newest policy ``spec`` names (see the module docstring). Runs are ranked by their status heartbeat."""
    if spec is None:
        return InitSource(None, None, None, None, None)
    if spec == CHAMPION:
        return _champion(root, registry, storage_options)
    if os.path.isfile(os.path.join(spec, "config.json")):
        return InitSource(spec, None, os.path.abspath(spec), None, None)
    names = [n for n in run_names(root, storage_options) if fnmatch.fnmatchcase(n, spec) and n != this_run]
    candidates = []
    for name in names:
        store = RunStore(root, name, storage_options)
        status = read_status(store)
        if store.exists(FINAL_MANIFEST):
            doc = store.get_json_file(FINAL_MANIFEST) or {}
            folder, version = FINAL, doc.get("policy_version")
        else:
            ref = checkpoint.latest(store)
            if ref is None:
                continue  # started, never got as far as a policy
            folder, version = ref.path, ref.policy_version
        candidates.append(InitSource(spec, name, folder, version, status.updated_at if status else None))
    if not candidates:
        return InitSource(spec, None, None, None, None)
    return max(candidates, key=lambda c: (c.finished_at or 0.0, c.run))


def recorded_or_resolved(store: RunStore, spec: str | None, root: str, storage_options: dict | None,
                         record: str = INIT_FROM, registry: "RegistryConfig | None" = None) -> tuple[InitSource, bool]:
    """(the source, whether it was recorded before): a run resolves ``init_from`` (or the distillation teacher, in
    ``teacher.json``) once, at its first start."""
    doc = store.get_json_file(record)
    if isinstance(doc, dict) and doc.get("spec") == spec:
        return InitSource(**{k: doc.get(k) for k in InitSource.__dataclass_fields__}), True
    source = resolve(spec, root, storage_options, store.run_name, registry)
    store.put_json_file(record, source.to_json())
    return source, False


def local_policy_folder(source: InitSource, root: str, storage_options: dict | None, cache_dir: str,
                        field: str = "model.init_from") -> str | None:
    """A local HF folder holding the source policy (None: start from model.path). On a remote run store the
    policy's files (not the learner state) are copied to ``cache_dir`` once. ``field``: the config field that
    named it, for the error."""
    if source.folder is None:
        return None
    if source.run is None:
        return source.folder
    store = RunStore(root, source.run, storage_options)
    files = {n: s for n, s in store.list_files(source.folder).items()
             if not n.startswith("learner/") and n not in (checkpoint.MANIFEST, checkpoint.STATE)}
    if "config.json" not in files:
        kind = "a LoRA adapter" if "adapter_config.json" in files else "no HF model"
        raise InitFromError(
            f"{field}={source.spec!r} resolved to {store.url(source.folder)}, which holds {kind}; use a full "
            "model (for a LoRA run: `grpo export --merge RUN OUT`, then that folder)")
    local = store.local_path(source.folder)
    if local is not None:
        return local
    target = os.path.join(cache_dir, source.run, source.folder.replace("/", "_"))
    for name, size in files.items():
        path = os.path.join(target, name)
        if not (os.path.isfile(path) and os.path.getsize(path) == size):
            store.get_file(f"{source.folder}/{name}", path)
    return target


def describe(source: InitSource, field: str = "model.init_from") -> str:
    if source.spec is None:
        return "model.path"
    if source.folder is None:
        if source.spec == CHAMPION:
            return f"model.path ({field}=champion: the registry has no champion yet)"
        return f"model.path ({field}={source.spec!r} matched no run with a policy yet)"
    if source.registry_version is not None:
        return (f"the registry's champion, version {source.registry_version}: run {source.run}'s {source.folder} "
                f"(policy version {source.policy_version})")
    if source.run is None:
        return f"{source.folder} ({field})"
    return f"run {source.run}'s {source.folder} (policy version {source.policy_version}; {field}={source.spec!r})"


def code_version() -> dict[str, Any]:
    """The git commit of the code running (and whether the checkout had changes); None outside a git checkout."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "where": here}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "where": git("rev-parse", "--show-toplevel") or here}


def file_digest(url: str, storage_options: dict | None) -> dict[str, Any]:
    """Size and sha256 of one data file (local or fsspec URL)."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return {"path": url, "size": int(fs.size(path)), "sha256": checkpoint.sha256_file(url, storage_options)}


def record_inputs(store: RunStore, data_files: dict[str, list[str]], storage_options: dict | None) -> dict:
    """At a run's first start: every data file's size and hash, and the code's commit (``lineage_inputs.json``);
    a resume keeps the first record."""
    doc = store.get_json_file(INPUTS)
    if isinstance(doc, dict):
        return doc
    doc = {"data": [{"role": role, **file_digest(path, storage_options)}
                    for role, paths in data_files.items() for path in paths],
           "code": code_version()}
    store.put_json_file(INPUTS, doc)
    return doc


def parent_of(store: RunStore) -> dict[str, Any]:
    """The model a run started from, as lineage records it: a registry version, another run's policy, or a
    model folder (model.path or an HF folder)."""
    doc = store.get_json_file(INIT_FROM) or {}
    config = store.read_config() or {}
    if doc.get("run"):
        return {"kind": "registry" if doc.get("registry_version") is not None else "run",
                "registry_version": doc.get("registry_version"), "run": doc["run"], "folder": doc.get("folder"),
                "policy_version": doc.get("policy_version")}
    path = doc.get("folder") or config.get("model", {}).get("path")
    return {"kind": "model", "path": path}


def version_lineage(store: RunStore, storage_options: dict | None) -> dict[str, Any]:
    """What a registered version records of where it came from (``grpo registry show --lineage``)."""
    # A run started before lineage was recorded gets its record now: its data files as they are now.
    recorded = store.get_json_file(DATA_FILES) or {}
    inputs = record_inputs(store, recorded.get("files", {}), storage_options)
    return {"parent": parent_of(store), "data": inputs["data"], "code": inputs["code"],
            "config": store.read_config()}


def walk(versions: "list[ModelVersion]", number: int) -> list[dict[str, Any]]:
    """The chain of models behind registry version ``number``, newest first: each registered version, then the
    first model (a model folder, or a run that was never registered)."""
    by_number = {v.version: v for v in versions}
    by_run = {v.run: v for v in versions}  # the newest version of each run (versions come oldest first)
    chain: list[dict[str, Any]] = []
    current = by_number.get(number)
    seen: set[int] = set()
    while current is not None and current.version not in seen:
        seen.add(current.version)
        lin = current.lineage
        chain.append({"version": current.version, "run": current.run, "decision": current.decision,
                      "registered_at": current.registered_at, "metrics": current.metrics,
                      "code": lin.get("code"), "data": lin.get("data"), "parent": lin.get("parent")})
        parent = lin.get("parent") or {}
        if parent.get("registry_version") is not None:
            current = by_number.get(parent["registry_version"])
        elif parent.get("run"):
            current = by_run.get(parent["run"])
            if current is None:
                chain.append({"run": parent["run"], "folder": parent.get("folder"), "registered": False})
        else:
            chain.append({"model": parent.get("path")})
            current = None
    return chain
