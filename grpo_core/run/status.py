"""What a run folder says about its run: ``status.json`` (written by the flow), and the summaries `grpo runs`
prints.

Why: an operator with many runs under one root needs to see at a glance which are running, finished or failed,
where each one stopped and where it can be resumed from, without opening parquet files. A run killed with SIGKILL
cannot record its end; its status stays "running" with a stale heartbeat, and a run on this host whose process is
gone is shown as "interrupted".
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec

from grpo_core.run import checkpoint
from grpo_core.infra.child_process import process_exists
from grpo_core.run.report import is_trained_row
from grpo_core.run.storage import CONFIG, RunStore

STATUS = "status.json"
# What an operator asks of a running flow (`grpo scale`); the flow reads it between iterations.
CONTROL = "control.json"
FINAL = "final"  # the finished policy's folder in a run
FINAL_MANIFEST = f"{FINAL}/MANIFEST.json"


class NotARunFolder(ValueError):
    """A path given for a run that holds no run; ``name`` and ``root`` are what it would be as a name under a root."""

    def __init__(self, folder: str):
        self.name, self.root = os.path.basename(folder), os.path.dirname(folder) or "."
        super().__init__(f"not a run folder (no {CONFIG} in {folder})")


def locate_run(run: str, root: str) -> tuple[str, str]:
    """(storage root, run name) of a run given as users type it: a run name under ``root``, or the path of a run
    folder (``runs/NAME``, ``/abs/runs/NAME/``), which names its own root. A path that is no run folder raises
    ``NotARunFolder``."""
    if "/" not in run.rstrip("/"):
        return root, run.rstrip("/") or run
    folder = os.path.normpath(run)
    if not os.path.isfile(os.path.join(folder, CONFIG)):
        raise NotARunFolder(folder)
    return os.path.dirname(folder) or ".", os.path.basename(folder)


@dataclass
class RunStatus:
    """The content of ``status.json``: written when a flow run starts, after every iteration and at its end."""

    state: str = "running"                      # running | finished | failed
    attempt: int = 0                            # 0 for the first start, +1 for every resume
    iteration: int | None = None                # the last iteration whose metrics row is written
    iterations: int = 0                         # the configured total
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    recoveries: int = 0                         # engine actors recreated in this attempt
    latest_checkpoint: str | None = None
    error: str | None = None
    # where the engine actors run: grpo_core.engine.results.PlacedActor while the flow holds them, their JSON when read back
    actors: list[Any] = field(default_factory=list)

    def write(self, store: RunStore) -> None:
        self.updated_at = time.time()
        store.put_json_file(STATUS, asdict(self))


def read_status(store: RunStore) -> RunStatus | None:
    doc = store.get_json_file(STATUS)
    if not isinstance(doc, dict):
        return None
    known = {k: v for k, v in doc.items() if k in RunStatus.__dataclass_fields__}
    return RunStatus(**known)


@dataclass
class RunSummary:
    name: str
    status: str
    iteration: int | None           # last iteration with a metrics row
    iterations: int | None          # configured total
    eval_accuracy: float | None     # last evaluation
    latest_checkpoint: str | None   # what a resume would start from
    policy_version: int | None
    attempt: int | None
    updated_at: float | None
    error: str | None = None


def effective_state(status: RunStatus | None) -> str:
    if status is None:
        return "unknown"
    if status.state == "running" and status.host == socket.gethostname() and not process_exists(status.pid):
        return "interrupted"
    return status.state


def summarize(store: RunStore) -> RunSummary:
    status = read_status(store)
    config = store.read_config() or {}
    metrics = store.read_metrics().to_pylist()
    trained = [r for r in metrics if is_trained_row(r)]
    evals = [r for r in metrics if r.get("eval_accuracy") is not None]
    ref = checkpoint.latest(store)
    return RunSummary(
        name=store.run_name, status=effective_state(status),
        iteration=trained[-1]["iteration"] if trained else None, iterations=config.get("iterations"),
        eval_accuracy=evals[-1]["eval_accuracy"] if evals else None,
        latest_checkpoint=ref.name if ref else None, policy_version=ref.policy_version if ref else None,
        attempt=status.attempt if status else None, updated_at=status.updated_at if status else None,
        error=status.error if status else None)


def run_names(root: str, storage_options: dict | None = None) -> list[str]:
    """The names of the run folders (folders with config.json) directly under ``root``, sorted."""
    fs, base = fsspec.core.url_to_fs(root, **(storage_options or {}))
    try:
        entries = fs.ls(base, detail=True)
    except FileNotFoundError:
        return []
    names = []
    for entry in sorted(entries, key=lambda e: e["name"]):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if entry.get("type") == "directory" and not name.startswith(".") \
                and RunStore(root, name, storage_options).exists(CONFIG):
            names.append(name)
    return names


def list_runs(root: str, storage_options: dict | None = None) -> list[RunSummary]:
    """A summary of every run folder directly under ``root``."""
    return [summarize(RunStore(root, name, storage_options)) for name in run_names(root, storage_options)]


def request_samplers(store: RunStore, count: int) -> None:
    """Ask the flow running ``store``'s run to run ``count`` sampler actors from its next iteration on (and after
    a resume)."""
    if count < 1:
        raise ValueError(f"a run needs at least one sampler, not {count}")
    control = store.get_json_file(CONTROL) or {}
    store.put_json_file(CONTROL, {**control, "samplers": int(count), "samplers_requested_at": time.time()})


def requested_samplers(store: RunStore) -> int | None:
    """The sampler count an operator asked for (``grpo scale``), or None."""
    control = store.get_json_file(CONTROL) or {}
    return control.get("samplers")

