"""Where a run's starting weights come from: ``model.init_from``, resolved once and recorded in the run folder.

Why: scheduled retraining ("every night, retrain from the newest policy on the newest data") needs a run to start
from another run's result without anyone editing a path. ``model.init_from`` names a run, a glob of runs under
``storage.root`` (``tiny-nightly-*``) or an HF folder; the run that starts picks the newest matching run that has a
policy (its ``final/``, else its latest committed checkpoint) and records the choice in ``init_from.json``. A
resume, or a Prefect retry of the same flow run, reads that record instead of resolving again, so the weights a run
started from never change under it (a newer run may have finished in the meantime).

Nothing matching (the first run of a schedule) means ``model.path``'s weights, recorded as such.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import asdict, dataclass
from typing import Any

from grpo_core import checkpoint
from grpo_core.runs import FINAL, FINAL_MANIFEST, read_status, run_names
from grpo_core.storage import RunStore

INIT_FROM = "init_from.json"
TEACHER = "teacher.json"


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve(spec: str | None, root: str, storage_options: dict | None, this_run: str) -> InitSource:
    """The newest policy ``spec`` names (see the module docstring). Runs are ranked by their status heartbeat."""
    if spec is None:
        return InitSource(None, None, None, None, None)
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
                         record: str = INIT_FROM) -> tuple[InitSource, bool]:
    """(the source, whether it was recorded before): a run resolves ``init_from`` (or the distillation teacher, in
    ``teacher.json``) once, at its first start."""
    doc = store.get_json_file(record)
    if isinstance(doc, dict) and doc.get("spec") == spec:
        return InitSource(**{k: doc.get(k) for k in InitSource.__dataclass_fields__}), True
    source = resolve(spec, root, storage_options, store.run_name)
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
        return f"model.path ({field}={source.spec!r} matched no run with a policy yet)"
    if source.run is None:
        return f"{source.folder} ({field})"
    return f"run {source.run}'s {source.folder} (policy version {source.policy_version}; {field}={source.spec!r})"
