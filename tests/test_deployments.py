"""Deployment files: every Prefect deployment's entrypoint loads as a flow (grpo-train, grpo-sft-rl) with flow-run
retries (a retried flow run resumes its run folders) and its configs resolve; the KubeRay manifest, the Prefect worker and
configs/cluster.yaml agree with each other and with the installed Ray."""
from __future__ import annotations

import importlib
import json
import re

import pytest
import yaml

from prefect.utilities.templating import apply_values

from grpo_core.config import load_config
from tests.conftest import REPO


# Each deployable flow's config parameters: (path, overrides).
CONFIGS_OF = {"grpo-train": [("config_path", "overrides")],
              "grpo-sft-rl": [("sft_config_path", "sft_overrides"), ("rl_config_path", "rl_overrides")]}


@pytest.mark.parametrize("spec_file", ["deployments/prefect.yaml", "infra/prefect.yaml"])
def test_deployments_point_at_the_flow_with_retries(spec_file, monkeypatch):
    spec = yaml.safe_load((REPO / spec_file).read_text())
    assert spec["deployments"]
    for dep in spec["deployments"]:
        path, attr = dep["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, attr)
        assert flow.name in CONFIGS_OF, dep["name"]
        assert flow.retries >= 1 and flow.retry_delay_seconds > 0, dep["name"]
        # `prefect deploy` fills {{ $VAR }} from the environment (grpo stack up sets GRPO_RAY_ADDRESS)
        monkeypatch.setenv("GRPO_RAY_ADDRESS", "127.0.0.1:6380")
        params = apply_values(dep["parameters"], {}, remove_notset=False)
        for path_key, overrides_key in CONFIGS_OF[flow.name]:
            cfg = load_config(REPO / params[path_key], params.get(overrides_key) or [])
            if spec_file == "deployments/prefect.yaml":
                assert cfg.cluster.ray_address == "127.0.0.1:6380", dep["name"]


def test_an_unresolved_ray_address_template_is_refused_with_what_to_do():
    from grpo_core.config import ConfigError

    with pytest.raises(ConfigError, match="unresolved deployment template.*GRPO_RAY_ADDRESS"):
        load_config(REPO / "configs/tiny.yaml", ["cluster.ray_address='{{ $GRPO_RAY_ADDRESS }}'"])


def test_the_nightly_deployment_retrains_from_the_champion_in_a_folder_of_its_own_and_gates(monkeypatch):
    from datetime import datetime, timezone

    spec = yaml.safe_load((REPO / "deployments/prefect.yaml").read_text())
    nightly = next(d for d in spec["deployments"] if d["name"] == "tiny-nightly")
    assert nightly["schedules"][0]["cron"]
    monkeypatch.setenv("GRPO_RAY_ADDRESS", "127.0.0.1:6380")
    params = apply_values(nightly["parameters"], {}, remove_notset=False)
    night = datetime(2026, 11, 24, 3, 0, 0, tzinfo=timezone.utc)
    cfg = load_config(REPO / params["config_path"], params["overrides"], now=night)
    assert cfg.run_name == "tiny-nightly-20261124-030000"
    assert cfg.model.init_from == "champion" and "*" in cfg.data.train_path
    assert cfg.gate is not None and cfg.registry.name == "tiny-nightly" and list(cfg.gate_sets()) == ["default"]


def _ray_start_resources(group: dict) -> dict[str, float]:
    """KubeRay's rayStartParams.resources: a JSON object inside a quoted string ('"{\\"x\\": 1}"')."""
    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(json.loads(raw)) if raw else {}


def test_cluster_manifest_serves_the_cluster_config():
    import ray

    cluster = yaml.safe_load((REPO / "infra/kuberay/raycluster.yaml").read_text())
    assert cluster["kind"] == "RayCluster"
    assert cluster["spec"]["rayVersion"] == ray.__version__, "the manifest's Ray must be the image's Ray"
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    cfg = load_config(REPO / "configs/cluster.yaml")
    for role, res in (("sampler", cfg.cluster.sampler_resources), ("learner", cfg.cluster.learner_resources)):
        for key in res.resources:
            offering = [name for name, g in groups.items() if key in _ray_start_resources(g)]
            assert len(offering) == 1, f"{role}s ask for resource {key!r}; worker groups offering it: {offering}"
            gpus = int(groups[offering[0]]["template"]["spec"]["containers"][0]["resources"]["limits"]
                       .get("nvidia.com/gpu", 0))
            count = cfg.cluster.samplers if role == "sampler" else cfg.cluster.learners
            per_actor = res.num_gpus  # a sampler's num_gpus covers its tensor-parallel workers (config rule)
            replicas = groups[offering[0]]["replicas"]
            assert count * per_actor <= gpus * replicas, f"{role}s need {count * per_actor} GPUs, group has " \
                                                        f"{gpus * replicas}"
    host = cluster["metadata"]["name"] + "-head-svc"
    assert cfg.cluster.ray_address == f"ray://{host}:10001"
    ports = {p["name"]: p["containerPort"]
             for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["client"] == 10001


def test_prefect_worker_polls_the_pool_of_the_cluster_deployment():
    worker = yaml.safe_load((REPO / "infra/prefect-worker.yaml").read_text())
    command = worker["spec"]["template"]["spec"]["containers"][0]["command"]
    pool = command[command.index("--pool") + 1]
    spec = yaml.safe_load((REPO / "infra/prefect.yaml").read_text())
    assert {d["work_pool"]["name"] for d in spec["deployments"]} == {pool}


def test_dockerfile_copies_what_exists():
    text = (REPO / "infra/Dockerfile").read_text()
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.M) for s in line.split()[:-1]]
    assert sources
    for src in sources:
        assert (REPO / src.rstrip("/")).exists(), f"infra/Dockerfile copies {src}, which is not in the repository"


def test_grpo_stack_runs_the_stack_script(capfd):
    """`grpo stack status` reports each service of infra/stack.sh (started by `grpo stack up`, `make stack-up`)."""
    from grpo_cli.commands import main

    assert main(["stack", "status"]) == 0
    out = capfd.readouterr().out
    for service in ("prefect-server", "prefect-worker", "s3"):
        assert f"{service}: " in out
