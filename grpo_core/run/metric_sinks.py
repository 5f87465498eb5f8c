"""Metrics where this field's users look: TensorBoard event files (default), W&B or MLflow (when installed).

``metrics.parquet`` stays the record a run resumes and reports from; the sinks are copies of its rows for the tools
people already have open. Each row is logged at ``step = iteration`` with its numeric columns under their
metrics.parquet names (timestamps ``*_at`` are left out: they are not curves). Offline-safe: W&B runs in offline
mode unless ``WANDB_MODE`` says otherwise, MLflow writes to ``mlflow.db`` (SQLite) in the run folder unless
``MLFLOW_TRACKING_URI`` is set; nothing here opens a network connection on its own.

Resume: TensorBoard's ``purge_step`` drops the events of iterations the resumed run redoes; W&B and MLflow resume
the same run (its id is kept in the run folder).
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpo_core.config import GRPOConfig
from grpo_core.run.storage import RunStore

TENSORBOARD = "tensorboard"
MLFLOW_DB = "mlflow.db"
_IDS = "tracking_ids.json"  # the W&B / MLflow run ids of this run, so that a resume continues them


@dataclass(frozen=True)
class SinkSettings:
    """What the sinks need of whoever logs: a run's config (``of_run``), or a service's settings (the Tinker
    service logs each training client as a run of its own)."""

    backends: tuple[str, ...]
    project: str
    run_name: str
    recorded: dict[str, Any] = field(default_factory=dict)  # shown as the run's config in W&B

    @classmethod
    def of_run(cls, cfg: GRPOConfig) -> "SinkSettings":
        return cls(tuple(cfg.logging.backends), cfg.logging.project, cfg.run_name, cfg.recorded())


class MetricSinkError(RuntimeError):
    """A configured backend cannot be used; the message names the setting and what to do."""


class MetricSink(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric, finite, non-timestamp values of a metrics row (booleans as 0/1)."""
    out = {}
    for key, value in row.items():
        if key == "iteration" or key.endswith("_at") or value is None or isinstance(value, str):
            continue
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


class TensorBoardSink:
    """Event files in ``<run>/tensorboard/`` (``tensorboard --logdir runs/`` shows every run). A remote run
    store gets them uploaded when the sink closes."""

    def __init__(self, store: RunStore, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.store = store
        local = store.local_path(TENSORBOARD)
        self._staging = None if local is not None else tempfile.mkdtemp(prefix="grpo-tb-")
        self.folder = local or self._staging
        self.writer = SummaryWriter(log_dir=self.folder, purge_step=start_step if start_step > 0 else None)

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        if self._staging is not None:
            self.store.move_in(TENSORBOARD, self._staging)
            self._staging = None


def _import(name: str):
    try:
        return __import__(name)
    except ModuleNotFoundError as err:
        if err.name != name:  # installed but broken: its own error says more than ours
            raise
        raise MetricSinkError(f"logging.backends includes {name}, but {name} is not installed in this environment: "
                              f"`pip install {name}`, or remove it from logging.backends") from None


class WandbSink:
    def __init__(self, cfg: SinkSettings, store: RunStore, ids: dict[str, str]):
        wandb = _import("wandb")
        os.environ.setdefault("WANDB_MODE", "offline")
        run_id = ids.setdefault("wandb", f"{cfg.run_name}-{os.urandom(4).hex()}")
        folder = store.uri if store.is_local else tempfile.mkdtemp(prefix="grpo-wandb-")
        self.run = wandb.init(project=cfg.project, name=cfg.run_name, id=run_id, resume="allow", dir=folder,
                              config=cfg.recorded)

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowSink:
    def __init__(self, cfg: SinkSettings, store: RunStore, ids: dict[str, str]):
        mlflow = _import("mlflow")
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            local = store.local_path(MLFLOW_DB)
            if local is None:
                raise MetricSinkError("logging.backends includes mlflow and the run store is remote: set "
                                      "MLFLOW_TRACKING_URI to your tracking server")
            os.makedirs(os.path.dirname(local), exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{local}")  # MLflow 3 retired its plain-folder store
        mlflow.set_experiment(cfg.project)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_id=ids.get("mlflow"), run_name=None if "mlflow" in ids else cfg.run_name)
        ids["mlflow"] = self.run.info.run_id

    def log(self, row: dict[str, Any], step: int) -> None:
        self.mlflow.log_metrics(scalars(row), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class MetricSinks:
    """The configured sinks, opened once per flow run at ``start_step`` (the iteration it starts at)."""

    def __init__(self, cfg: SinkSettings, store: RunStore, start_step: int):
        self.store = store
        ids = dict(store.get_json_file(_IDS) or {})
        self.sinks: list[MetricSink] = []
        for name in cfg.backends:
            if name == "tensorboard":
                self.sinks.append(TensorBoardSink(store, start_step))
            elif name == "wandb":
                self.sinks.append(WandbSink(cfg, store, ids))
            elif name == "mlflow":
                self.sinks.append(MLflowSink(cfg, store, ids))
        if ids:
            store.put_json_file(_IDS, ids)

    @classmethod
    def of_run(cls, cfg: GRPOConfig, store: RunStore, start_step: int) -> "MetricSinks":
        return cls(SinkSettings.of_run(cfg), store, start_step)

    def log(self, row: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(row, int(row["iteration"]))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
