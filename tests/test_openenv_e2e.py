"""An OpenEnv environment drives a run: the run starts grpo_outside/openenv_driver.py (in .venv-envs, `make envs`) as
a client of its policy endpoint; the driver plays the episodes of examples/openenv/arith_env.py (openenv-core's
Environment, its Rubric the reward) through the endpoint, and every group the run trains on is one of them, with the
rubric's reward and the sampled tokens. The driver plays 9 tasks for 3 iterations of 4: the last iteration waits in
vain, then goes on with its one group (the rest of the batch masked out)."""
from __future__ import annotations

import re

import pytest

from grpo_core.run.storage import RunStore
from tests.conftest import REPO
from tests.outside_clients import client_driven_config, venv_python

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]


def test_an_openenv_environment_drives_a_run_through_the_endpoint(tiny_model, tmp_path, prefect_harness,
                                                                  monkeypatch):
    from transformers import AutoTokenizer

    from flows.grpo_train import grpo_train

    python = venv_python(".venv-envs", "openenv-core")
    monkeypatch.delenv("GRPO_ENDPOINT_TOKEN", raising=False)
    monkeypatch.chdir(REPO)  # the driver's paths
    driver = [python, "grpo_outside/openenv_driver.py", "--base-url", "{endpoint_url}", "--model",
              "{model_name}", "--group-size", "{group_size}", "--env", "examples/openenv/arith_env.py:make_env",
              "--action", "examples/openenv/arith_env.py:ArithAction", "--seed", "0", "--tasks", "9",
              "--system-prompt", "Please reason step by step, and put your final answer within \\boxed{}."]
    # the wait: long enough for the driver's start (its imports alone take seconds on a busy machine), the last
    # iteration's wait in vain
    cfg = client_driven_config(tiny_model, tmp_path, "openenv", [driver], iterations=3, groups_wait_s=30)
    grpo_train(config=cfg)
    store = RunStore(str(tmp_path), "openenv")
    assert store.get_json_file("status.json")["state"] == "finished"
    rows = store.read_metrics().to_pylist()
    trained = [r for r in rows if r.get("loss") is not None]
    assert [r["inbox_groups"] for r in trained] == [4, 4, 1]
    assert [r["outside_short_groups"] for r in trained] == [0, 0, 3]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for it in range(3):
        assert store.entry(it, "rollouts.parquet").rows == 0  # the run sampled nothing of its own
        table = store.get_table(it, "inbox.parquet").to_pylist()
        groups = 4 if it < 2 else 1
        assert len(table) == 4 * groups and len({r["group_id"] for r in table}) == groups
        scored = store.get_table(it, "scored.parquet").to_pylist()  # the learner's batch is whole, the rest masked
        assert len(scored) == 16 and sum(r["kept"] for r in scored) == 4 * groups
        for row in table:
            assert row["sampler_id"] == -1 and all(row["response_mask"]) and row["episode_id"].startswith("openenv-")
            # the reward is the environment's rubric on the text the endpoint sampled: 1 iff the last box is the sum
            question = tokenizer.decode(row["prompt_token_ids"])
            a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", question).groups())
            boxes = re.findall(r"\\boxed\{([^{}]*)\}", row["response_text"])
            assert row["reward"] == (1.0 if boxes and boxes[-1].strip() == str(a + b) else 0.0)
        prompts = {}
        for row in table:  # a group is one task: G episodes from one reset seed
            prompts.setdefault(row["group_id"], set()).add(tuple(row["prompt_token_ids"]))
        assert all(len(p) == 1 for p in prompts.values())
    log = (tmp_path / "openenv" / "clients" / "client0.log").read_text()
    assert "rewards [" in log
