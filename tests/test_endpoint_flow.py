"""A run with the policy endpoint: an outside agent (the OpenAI SDK, in a thread) answers tasks through it, finishes
each episode with its reward and task group, and the run trains on those groups with the tokens the agent was
served."""
from __future__ import annotations

import json
import re
import threading
import time

import pyarrow.parquet as pq
import pytest

from grpo_core.run.storage import RunStore
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

TASKS = [(a, b) for a in range(3, 9) for b in range(2, 6)]


def _agent(store: RunStore, served: dict[str, list[int]], stop: threading.Event, errors: list[str]) -> None:
    """Until the run ends: per task, 4 episodes of one turn each, rewarded 1 when the boxed answer is right."""
    import httpx
    from openai import APIConnectionError, APIStatusError, OpenAI

    while not stop.is_set() and store.get_json_file("endpoint.json") is None:
        time.sleep(0.05)
    doc = store.get_json_file("endpoint.json")
    if doc is None:
        return
    client = OpenAI(base_url=doc["url"], api_key=doc["token"], max_retries=0)
    for t, (a, b) in enumerate(TASKS * 4):
        if stop.is_set():
            return
        try:
            for i in range(doc["group_size"]):
                episode = f"task-{t}-{i}"
                out = client.chat.completions.create(
                    model=doc["model"], messages=[{"role": "user", "content": f"What is {a} + {b}?"}],
                    extra_headers={"X-Episode-Id": episode})
                served[episode] = out.choices[0].model_extra["token_ids"]
                found = re.findall(r"\\boxed\{(-?\d+)\}", out.choices[0].message.content or "")
                reward = 1.0 if found and int(found[-1]) == a + b else 0.0
                done = httpx.post(f"{doc['url']}/episodes/{episode}/finish", json={"reward": reward,
                                                                                   "group": f"task-{t}"},
                                  headers={"Authorization": f"Bearer {doc['token']}"})
                done.raise_for_status()
        except (httpx.ConnectError, APIConnectionError):
            return  # the run ended and closed its endpoint (checked after the run: it did finish)
        except (APIStatusError, httpx.HTTPStatusError) as exc:
            body = exc.body if isinstance(exc, APIStatusError) else exc.response.json().get("error")
            if isinstance(body, dict) and body.get("code") == "run_stopping":
                return  # the run is ending: the endpoint refuses new calls (its documented answer)
            errors.append(repr(exc))
            return
        except Exception as exc:  # noqa: BLE001 - anything else is the endpoint's failure
            errors.append(repr(exc))
            return


def _hostile(store: RunStore, attempts: list, stop: threading.Event, errors: list[str]) -> None:
    """Issue 53's findings, each one request, sent while the run trains (tests/hostile_client.py)."""
    from tests.hostile_client import attack, wait_for_endpoint

    doc = wait_for_endpoint(store, stop)
    if doc is None:
        return
    try:
        attack(doc, attempts, context_tokens=96 + 16)
    except Exception as exc:  # noqa: BLE001 - a connection the endpoint dropped is its failure
        errors.append(f"hostile client: {exc!r}")


def test_an_outside_agent_drives_training_through_the_endpoint(tiny_model, tmp_path, prefect_harness, monkeypatch):
    """... while a hostile but authorised client sends, one by one, every request that once took a run down (issue
    53): each is refused at the door with the field named (or kept as rejected), and the run trains on to its end."""
    from flows.grpo_train import grpo_train

    monkeypatch.delenv("GRPO_ENDPOINT_TOKEN", raising=False)  # the run makes a token and writes it down
    cfg = tiny_config(tiny_model, str(tmp_path), run_name="outside", iterations=8, eval__interval=0,
                      rollout__prompts_per_iteration=4, rollout__samples_per_prompt=4, rollout__max_staleness=1,
                      rollout__inbox_max_staleness=4,
                      cluster__placement="split", cluster__sampler_resources={"num_cpus": 0.5}, endpoint={})
    store = RunStore(str(tmp_path), "outside")
    served: dict[str, list[int]] = {}
    errors: list[str] = []
    stop = threading.Event()
    agent = threading.Thread(target=_agent, args=(store, served, stop, errors), daemon=True)
    attempts: list = []
    hostile = threading.Thread(target=_hostile, args=(store, attempts, stop, errors), daemon=True)
    agent.start()
    hostile.start()
    try:
        grpo_train(config=cfg)
    finally:
        stop.set()
        agent.join(timeout=60)
        hostile.join(timeout=60)
    doc = json.loads((tmp_path / "outside" / "endpoint.json").read_text())
    assert doc["token"] and (tmp_path / "outside" / "endpoint.json").stat().st_mode & 0o077 == 0
    assert not errors, errors
    assert store.get_json_file("status.json")["state"] == "finished"
    # every hostile request answered as the door says, none a 500; the run trained all its iterations meanwhile
    assert len(attempts) == 22, [a.name for a in attempts]
    assert all(a.held() for a in attempts), [(a.name, a.status, a.body) for a in attempts if not a.held()]
    finishes = [a.body for a in attempts if a.name.startswith("a group of mixed prompts")]
    assert [f["group_rejected"] is None for f in finishes] == [True, True, True, False]
    why = finishes[-1]["group_rejected"]
    assert why["field"] == "prompt_token_ids" and "starts from another prompt" in why["error"]
    kept = tmp_path / "outside" / "inbox" / "rejected" / f"{why['item']}.parquet"
    assert len(pq.read_table(kept)) == 4  # all four episodes kept, none lost
    rows = [r for r in store.read_metrics().to_pylist() if r["iteration"] < 8]
    taken = [k for k, r in enumerate(rows) if r["inbox_groups"]]
    assert taken, [r["inbox_groups"] for r in rows]
    for k in taken:  # what was trained on is what the agent was served, token for token
        table = store.get_table(k, "inbox.parquet").to_pylist()
        assert len(table) == rows[k]["inbox_groups"] * 4
        for row in table:
            assert row["response_token_ids"] in served.values() and all(row["response_mask"])
            assert row["sampler_id"] == -1
        assert store.entry(k, "train.json") is not None
