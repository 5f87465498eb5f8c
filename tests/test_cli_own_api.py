"""`grpo train` with no Prefect API configured starts its own (Prefect's temporary server), with the settings that
``grpo_cli.commands`` gives it: its task-run recorder commits task-run events in batches, so the run must still leave
every task run of every iteration in the database, completed, once it ends."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ITERATIONS = 3

READ_TASK_RUNS = """
import json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["own-api"])))
    task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [r.id for r in runs]}), limit=200)
    print(json.dumps({"flow_runs": [r.state_name for r in runs],
                      "task_runs": {t.name: t.state_name for t in task_runs}}))
"""


def test_every_task_run_reaches_the_runs_own_prefect_api(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, str(tmp_path / "runs"), run_name="own-api", iterations=ITERATIONS,
                      eval__interval=0)
    path = tmp_path / "own-api.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_LOGGING_LEVEL="WARNING")
    run = subprocess.run([sys.executable, "-m", "grpo_cli.main", "train", "--config", str(path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # Read back through another temporary server on the same database: what the UI shows after the run.
    read = subprocess.run([sys.executable, "-c", READ_TASK_RUNS], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert read.returncode == 0, read.stderr[-3000:]
    seen = json.loads(read.stdout.strip().splitlines()[-1])
    assert seen["flow_runs"] == ["Completed"], seen
    expected = [name.format(it) for it in range(ITERATIONS)
                for name in ("rollout-{:06d}-r0", "score-{:06d}", "train-{:06d}", "sync-{:06d}", "record-{:06d}")]
    missing = [name for name in expected if seen["task_runs"].get(name) != "Completed"]
    assert not missing, f"task runs missing or not completed: {missing}; recorded: {sorted(seen['task_runs'])}"
