"""A verifiers environment drives a run: the run starts grpo_outside/verifiers_driver.py (in .venv-verifiers, `make
envs`) as a client of its policy endpoint; the driver loads examples/verifiers/arith_vf.py by its module name, runs
each rollout behind verifiers' interception server (which relays the model calls to the endpoint, each tagged with
the rollout's episode id by its sampling), scores it with the taskset's reward and finishes it into its task's
group. Every group the run trains on is one of those, with that reward on the tokens the endpoint sampled; a client
whose rollouts fail has its groups discarded, never trained on."""
from __future__ import annotations

import re

import pytest

from grpo_core.run.storage import RunStore
from tests.conftest import REPO
from tests.outside_clients import client_driven_config, venv_python

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]


def test_a_verifiers_environment_drives_a_run_through_the_endpoint(tiny_model, tmp_path, prefect_harness,
                                                                   monkeypatch):
    from transformers import AutoTokenizer

    from flows.grpo_train import grpo_train

    python = venv_python(".venv-verifiers", "verifiers")
    monkeypatch.delenv("GRPO_ENDPOINT_TOKEN", raising=False)
    monkeypatch.chdir(REPO)  # the driver's paths
    driver = [python, "grpo_outside/verifiers_driver.py", "--base-url", "{endpoint_url}", "--model",
              "{model_name}", "--group-size", "{group_size}", "--taskset", "arith_vf", "--path", "examples/verifiers",
              "--seed", "0", "--tasks", "8"]
    # A second client whose every rollout fails (it names a model the endpoint does not serve): its groups are
    # discarded, with the reason in its log, and the run trains on the first one's.
    failing = [a if a != "{model_name}" else "not-this-run" for a in driver[:-2]] + ["--tasks", "2"]
    cfg = client_driven_config(tiny_model, tmp_path, "vf", [driver, failing], iterations=2, groups_wait_s=120)
    grpo_train(config=cfg)
    store = RunStore(str(tmp_path), "vf")
    assert store.get_json_file("status.json")["state"] == "finished"
    rows = [r for r in store.read_metrics().to_pylist() if r.get("loss") is not None]
    assert [r["inbox_groups"] for r in rows] == [4, 4] and [r["outside_short_groups"] for r in rows] == [0, 0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for it in range(2):
        assert store.entry(it, "rollouts.parquet").rows == 0  # the run sampled nothing of its own
        table = store.get_table(it, "inbox.parquet").to_pylist()
        assert len(table) == 16 and len({r["group_id"] for r in table}) == 4
        episodes = {}
        for row in table:
            assert row["sampler_id"] == -1 and all(row["response_mask"]) and row["episode_id"].startswith("verifiers-")
            # the taskset's reward on the text the endpoint sampled: 1 iff the last box holds the sum
            question = tokenizer.decode(row["prompt_token_ids"])
            assert "within \\boxed{}" in question  # the task's system prompt reached the policy
            a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", question).groups())
            boxes = re.findall(r"\\boxed\{([^{}]*)\}", row["response_text"])
            assert row["reward"] == (1.0 if boxes and boxes[-1].strip() == str(a + b) else 0.0)
            episodes.setdefault(row["group_id"], set()).add((row["episode_id"].rsplit("-", 1)[0],
                                                            tuple(row["prompt_token_ids"])))
        assert all(len(e) == 1 for e in episodes.values())  # a group: one task, one driver group name
    log = (tmp_path / "vf" / "clients" / "client0.log").read_text()
    assert "rewards [" in log and "failed" not in log
    failed = (tmp_path / "vf" / "clients" / "client1.log").read_text()
    assert failed.count("discarded, 4 rollout(s) failed") == 2 and "model_not_found" in failed
    assert "rewards [" not in failed
