"""One iteration with the run folder on a real S3 server (SeaweedFS on a loopback port)."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import s3fs

from grpo_core.data.schemas import ROLLOUT_FIELDS, SCORE_FIELDS, check_schema
from grpo_core.storage import RunStore
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_one_iteration_on_s3(tiny_model, s3_server, prefect_harness):
    from flows.grpo_train import grpo_train

    root = f"s3://{s3_server['bucket']}/runs"
    cfg = tiny_config(tiny_model, root, run_name="s3run", iterations=1, eval__interval=0,
                      storage__options=s3_server["storage_options"])
    result = grpo_train(config=cfg)
    assert result["run"] == f"{root}/s3run"

    # Read back through the project's store and, independently, through s3fs + pyarrow.
    store = RunStore(root, "s3run", s3_server["storage_options"])
    assert store.list_complete_iterations() == [0]
    assert store.read_metrics().column("iteration").to_pylist() == [0]
    fs = s3fs.S3FileSystem(**s3_server["storage_options"])
    base = f"{s3_server['bucket']}/runs/s3run"
    rollouts = pq.read_table(f"{base}/iter-000000/rollouts.parquet", filesystem=fs)
    check_schema(rollouts, ROLLOUT_FIELDS, "rollouts.parquet on S3")
    scored = pq.read_table(f"{base}/iter-000000/scored.parquet", filesystem=fs)
    check_schema(scored, ROLLOUT_FIELDS + SCORE_FIELDS, "scored.parquet on S3")
    assert scored.num_rows == rollouts.num_rows == 8 * 4
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{base}/iter-000000")}
    assert {"rollouts.parquet", "scored.parquet", "train.json", "MANIFEST.json"} <= names
    assert fs.exists(f"{base}/final/model.safetensors") and fs.exists(f"{base}/curves.png")
