"""Metric sinks: TensorBoard event files that a resume rewrites from where it restarts; clear errors for missing
backends."""
from __future__ import annotations

import json
import math
import sys

import pytest

from grpo_core.config import load_config
from grpo_core.run.metric_sinks import MetricSinkError, MetricSinks, scalars
from grpo_core.run.storage import RunStore


def _read(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {e.step: e.value for e in events.Scalars("loss")}


def test_scalars_keep_numbers_only():
    row = {"iteration": 3, "loss": 0.5, "resynced": True, "eval_accuracy": None, "rollout_started_at": 1e9,
           "note": "x", "grad_norm": math.nan}
    assert scalars(row) == {"loss": 0.5, "resynced": 1.0}


def test_a_resume_replaces_the_iterations_it_redoes(tmp_path):
    cfg = load_config(None)
    store = RunStore(str(tmp_path), "run")
    sinks = MetricSinks.of_run(cfg, store, start_step=0)
    for it in range(5):
        sinks.log({"iteration": it, "loss": float(it)})
    sinks.close()
    assert _read(tmp_path / "run" / "tensorboard") == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    resumed = MetricSinks.of_run(cfg, store, start_step=3)  # the checkpoint was after iteration 2
    for it in range(3, 6):
        resumed.log({"iteration": it, "loss": 10.0 + it})
    resumed.close()
    assert _read(tmp_path / "run" / "tensorboard") == {0: 0.0, 1: 1.0, 2: 2.0, 3: 13.0, 4: 14.0, 5: 15.0}


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_backend_that_is_not_installed_is_named(tmp_path, backend, monkeypatch):
    monkeypatch.setitem(sys.modules, backend, None)  # not importable, whether or not it is installed here
    cfg = load_config(None, [f"logging.backends=[{backend}]"])
    with pytest.raises(MetricSinkError, match=f"logging.backends includes {backend}.*pip install {backend}"):
        MetricSinks.of_run(cfg, RunStore(str(tmp_path), "run"), start_step=0)


def _wandb_history(run_folder) -> dict[str, list[tuple[int, dict]]]:
    """Each offline W&B run under ``run_folder`` (its id -> the (step, row) it logged), read from the .wandb files
    themselves: the log format of W&B's datastore (LevelDB's: 32 KiB blocks, 7-byte record headers, records split
    across blocks as FIRST/MIDDLE/LAST) holding its protobuf Records."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    runs: dict[str, list[tuple[int, dict]]] = {}
    for path in sorted(run_folder.glob("wandb/offline-run-*/run-*.wandb")):
        raw, pos, pending = path.read_bytes(), 7, b""  # after the file header (":W&B", version)
        while pos + 7 <= len(raw):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
            pos += 7
            if length == 0 and kind == 0:  # the zero padding at a block's end
                pos += left - 7
                continue
            pending += raw[pos:pos + length]
            pos += length
            if kind in (1, 4):  # FULL or LAST
                record = pb.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                    row = {k: v for k, v in items.items() if not k.startswith("_")}  # W&B's own _step, _runtime
                    runs.setdefault(path.stem.removeprefix("run-"), []).append((record.history.step.num, row))
    return runs


def test_wandb_offline_holds_the_rows_under_their_metrics_parquet_names_and_a_resume_continues_it(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the sink's default: offline, no account, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, ["logging.backends=[wandb]", "run_name=run"])
    store = RunStore(str(tmp_path), "run")
    sinks = MetricSinks.of_run(cfg, store, start_step=0)
    for it in range(3):
        sinks.log({"iteration": it, "loss": 0.5 + it, "eval_accuracy": None, "rollout_started_at": 1e9})
    sinks.close()
    resumed = MetricSinks.of_run(cfg, store, start_step=2)
    resumed.log({"iteration": 2, "loss": 9.0, "eval_accuracy": 0.75})
    resumed.close()
    runs = _wandb_history(tmp_path / "run")
    assert list(runs) == [json.loads((tmp_path / "run" / "tracking_ids.json").read_text())["wandb"]]
    assert runs[next(iter(runs))] == [(0, {"loss": 0.5}), (1, {"loss": 1.5}), (2, {"loss": 2.5}),
                                      (2, {"loss": 9.0, "eval_accuracy": 0.75})]


def test_mlflow_holds_the_rows_in_the_run_folder_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(None, ["logging.backends=[mlflow]", "run_name=run"])
    store = RunStore(str(tmp_path), "run")
    for start, rows in ((0, [(0, 0.5), (1, 1.5)]), (1, [(1, 9.0)])):
        sinks = MetricSinks.of_run(cfg, store, start_step=start)
        for it, loss in rows:
            sinks.log({"iteration": it, "loss": loss})
        sinks.close()
    run_id = json.loads((tmp_path / "run" / "tracking_ids.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss")) == \
        [(0, 0.5), (1, 1.5), (1, 9.0)]


def test_a_remote_store_gets_the_event_files_and_the_local_staging_is_removed(s3_server, tmp_path, monkeypatch):
    """With an S3 run folder the event files (and the run's log files, tasks/run_log.py) are written to a local
    staging folder and uploaded when the sink closes; the staging folder goes with the upload, so a machine that
    runs many remote runs does not fill its temporary folder."""
    from rich.console import Console

    from tasks.run_log import run_logging

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    cfg = load_config(None)
    store = RunStore(f"s3://{s3_server['bucket']}/sinks-{tmp_path.name}", "run", s3_server["storage_options"])
    with run_logging(cfg, store, Console(file=open(tmp_path / "terminal.txt", "w"))):
        sinks = MetricSinks.of_run(cfg, store, start_step=0)
        sinks.log({"iteration": 0, "loss": 0.5})
        assert len(list(scratch.iterdir())) == 2  # the logs' staging and TensorBoard's, while the run goes on
        sinks.close()
    assert list(scratch.iterdir()) == []
    assert store.fs.ls(f"{store.uri}/tensorboard") and store.fs.ls(f"{store.uri}/logs")
