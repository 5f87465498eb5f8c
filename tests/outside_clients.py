"""What the tests of outside environments driving a run share: the driver's interpreter in its own virtual
environment, and a small split-placement run whose every group comes from the endpoint's clients."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO, tiny_config


def venv_python(venv: str, what: str) -> str:
    python = REPO / venv / "bin" / "python"
    assert python.exists(), f"{what} is missing: `make envs` builds {venv} (make test-e2e does)"
    return str(python)


def client_driven_config(tiny_model: str, root: Path, run_name: str, clients: list[list[str]], iterations: int,
                         groups_wait_s: float) -> dict:
    """4 groups of 4 per iteration, all from ``clients``, split placement, one more version of inbox lag."""
    return tiny_config(tiny_model, str(root), run_name=run_name, iterations=iterations, eval__interval=0,
                       rollout__prompts_per_iteration=4, rollout__samples_per_prompt=4, rollout__max_staleness=1,
                       rollout__inbox_max_staleness=2, cluster__placement="split",
                       cluster__sampler_resources={"num_cpus": 0.5},
                       endpoint={"clients": clients, "groups_wait_s": groups_wait_s})
