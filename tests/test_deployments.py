"""deployments/prefect.yaml: every deployment's entrypoint loads as the grpo-train flow, with flow-run retries (a
retried flow run resumes its run folder), and its config resolves."""
from __future__ import annotations

import importlib

import yaml

from grpo_core.config import load_config
from tests.conftest import REPO


def test_deployments_point_at_the_flow_with_retries():
    spec = yaml.safe_load((REPO / "deployments/prefect.yaml").read_text())
    assert spec["deployments"]
    for dep in spec["deployments"]:
        path, attr = dep["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, attr)
        assert flow.name == "grpo-train", dep["name"]
        assert flow.retries >= 1 and flow.retry_delay_seconds > 0, dep["name"]
        params = dep["parameters"]
        load_config(REPO / params["config_path"], params.get("overrides") or [])
