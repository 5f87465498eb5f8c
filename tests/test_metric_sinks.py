"""Metric sinks: TensorBoard event files that a resume rewrites from where it restarts; clear errors for missing
backends."""
from __future__ import annotations

import math
import sys

import pytest

from grpo_core.config import load_config
from grpo_core.metric_sinks import MetricSinkError, MetricSinks, scalars
from grpo_core.storage import RunStore


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
    sinks = MetricSinks(cfg, store, start_step=0)
    for it in range(5):
        sinks.log({"iteration": it, "loss": float(it)})
    sinks.close()
    assert _read(tmp_path / "run" / "tensorboard") == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    resumed = MetricSinks(cfg, store, start_step=3)  # the checkpoint was after iteration 2
    for it in range(3, 6):
        resumed.log({"iteration": it, "loss": 10.0 + it})
    resumed.close()
    assert _read(tmp_path / "run" / "tensorboard") == {0: 0.0, 1: 1.0, 2: 2.0, 3: 13.0, 4: 14.0, 5: 15.0}


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_backend_that_is_not_installed_is_named(tmp_path, backend, monkeypatch):
    monkeypatch.setitem(sys.modules, backend, None)  # not importable, whether or not it is installed here
    cfg = load_config(None, [f"logging.backends=[{backend}]"])
    with pytest.raises(MetricSinkError, match=f"logging.backends includes {backend}.*pip install {backend}"):
        MetricSinks(cfg, RunStore(str(tmp_path), "run"), start_step=0)
