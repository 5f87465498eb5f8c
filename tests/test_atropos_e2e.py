"""The run as an Atropos trainer, against atroposlib's own API server (``run-api`` from .venv-envs, `make envs`):

- the pulls and their faults, with a scripted environment process: unusable groups refused with the reason, an
  environment that exits started again, the API server killed and started again (the run registers again), a
  starved pull and an environment out of restarts failing with the state of each;
- a whole run driven by the Atropos environment of the demo (examples/atropos/arith_env.py, atroposlib's BaseEnv in
  its own virtual environment), SIGKILLed mid-run with its API server and environment, and resumed: every group it
  trains on pulled once and trained once, nothing pulled lost (`make test-long`: about four minutes on 2 cores).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from grpo_core.outside.atropos.client import AtroposClient, Registration
from grpo_core.outside.atropos.groups import MASKED, GroupLimits
from grpo_core.outside.atropos.source import AtroposSource
from grpo_core.infra.child_process import ChildProcess
from grpo_core.outside.endpoint.ledger import SampledLedger
from grpo_core.infra.netaddr import free_port
from grpo_core.outside.source import GroupRefused, SourceStarved, Supervisor
from grpo_core.pipeline.inbox import INBOX, REJECTED
from grpo_core.run.storage import RunStore
from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

ENVS_PYTHON = REPO / ".venv-envs" / "bin" / "python"


@pytest.fixture(scope="module")
def run_api() -> Path:
    path = REPO / ".venv-envs" / "bin" / "run-api"
    assert path.exists(), "atroposlib's run-api is missing: `make envs` builds .venv-envs (make test-e2e does)"
    return path


class _Sink:
    def __init__(self):
        self.tables, self.errors = [], []

    def accepted(self, table):
        self.tables.append(table)

    def refused(self, group, error: GroupRefused):
        self.errors.append(error)


def _group(ledger: SampledLedger, base: int, record: bool = True) -> dict:
    prompt = [1, 2, base]
    answers = [[base + 1, base + 2], [base + 3]]
    if record:
        for answer in answers:
            ledger.record(prompt, answer, [-0.5] * len(answer), "stop", 0)
    return {"tokens": [prompt + a for a in answers], "masks": [[MASKED] * 3 + a for a in answers],
            "scores": [1.0, 0.0]}


def _drop(folder: Path, name: str, group: dict) -> None:
    (folder / f"{name}.json.tmp").write_text(json.dumps(group))
    (folder / f"{name}.json.tmp").rename(folder / f"{name}.json")


def test_pulls_refuse_bad_groups_and_survive_an_environment_exit_and_an_api_server_restart(run_api, tmp_path):
    ledger, groups = SampledLedger(), tmp_path / "groups"
    groups.mkdir()
    port = free_port()
    api = ChildProcess("atropos-api", [str(run_api), "--host", "127.0.0.1", "--port", str(port)],
                       tmp_path / "api.log")
    producer = ChildProcess("env0", [sys.executable, str(REPO / "tests" / "atropos_producer.py"),
                                     f"http://127.0.0.1:{port}", str(groups)], tmp_path / "env0.log")
    source = AtroposSource(
        client=AtroposClient(f"http://127.0.0.1:{port}"),
        registration=Registration("test", "grpo", 2, 64, str(tmp_path), -1, 0, 1000),
        limits=GroupLimits(group_size=2, vocab_size=100), ledger=ledger, decode=str, api=api,
        envs=Supervisor([producer], restarts=3), wait_s=15.0, api_timeout_s=30.0, poll_s=0.05)
    sink = _Sink()

    def fill(wanted: int):  # no staleness rule here; the inbox holds what the sink accepted
        return source.fill(len(sink.tables) + wanted, sink, lambda table: None, lambda: len(sink.tables))

    try:
        source.start()
        _drop(groups, "a", _group(ledger, 10))
        bad = _group(ledger, 20)
        bad["tokens"][1][-1] = 100  # outside the vocabulary
        _drop(groups, "b", bad)
        _drop(groups, "c", _group(ledger, 30, record=False))  # never sampled by this run
        _drop(groups, "d", _group(ledger, 40))
        stats = fill(2)
        assert (stats.groups, stats.refused) == (2, 2)
        # (several batches ready at once come newest first: atroposlib's /batch pops its list)
        assert sorted(t.column("prompt_token_ids").to_pylist()[0][-1] for t in sink.tables) == [10, 40]
        reasons = sorted((e.sequence, e.field, "vocabulary" in e.reason, "not an answer" in e.reason)
                         for e in sink.errors)
        assert reasons == [(0, "tokens", False, True), (1, "tokens", True, False)]

        # the environment exits; it is started again and sends what it had not
        producer.process.kill()
        producer.process.wait()
        _drop(groups, "e", _group(ledger, 50))
        stats = fill(1)
        assert (stats.groups, stats.process_restarts) == (1, 1)

        # the API server dies: started again, registered again; the environment, whose post fails, exits and is
        # started again, registers with the new server and sends the rest
        api.process.kill()
        api.process.wait()
        _drop(groups, "f", _group(ledger, 60))
        stats = fill(1)
        assert stats.groups == 1 and stats.server_restarts == 1
        assert sink.tables[-1].column("prompt_token_ids").to_pylist()[0][-1] == 60

        # nothing more comes for wait_s: with groups in hand the iteration goes on short of the rest; with none,
        # the silent (hung) environment is started again and waited for once more, then the run fails with each
        # environment's state
        source.wait_s = 1.0
        stats = fill(1)
        assert (stats.groups, stats.short) == (0, 1)
        starts = producer.starts
        with pytest.raises(SourceStarved, match=r"no usable group .* for 1 s .*env0: running"):
            source.fill(1, sink, lambda table: None, lambda: 0)
        assert producer.starts == starts + 1

        # an environment that keeps exiting fails the run once its restarts are used
        (groups / "crash").write_text("")
        producer.process.kill()
        with pytest.raises(SourceStarved, match=r"env0 exited \(-?\d+\) after \d starts"):
            for _ in range(200):
                fill(1)
                time.sleep(0.05)
    finally:
        source.close()
    assert not api.running() and not producer.running()


def _atropos_config(model: str, root: str, name: str, iterations: int) -> dict:
    cfg = tiny_config(model, root, run_name=name, iterations=iterations, eval__interval=0,
                      rollout__prompts_per_iteration=4, rollout__samples_per_prompt=4, rollout__max_staleness=1,
                      cluster__placement="split", checkpoint__interval=1)
    cfg["endpoint"] = {}
    cfg["atropos"] = {"envs": [[str(ENVS_PYTHON), "examples/atropos/arith_env.py", "serve",
                                "--env.tokenizer_name", "{model_path}", "--env.group_size", "{group_size}",
                                "--env.rollout_server_url", "{api_url}", "--openai.base_url", "{endpoint_url}",
                                "--openai.model_name", "policy", "--openai.tokenizer_name", "{model_path}",
                                "--env.max_batches_offpolicy", "4", "--env.ensure_scores_are_not_same", "False"]],
                      "wait_s": 120}
    return cfg


# make test-e2e: the pulls against atroposlib's own API server and environment (above); make test: the groups'
# rules at the door (tests/test_endpoint_doors.py) and runs killed and resumed (tests/test_resume.py)
@pytest.mark.long
def test_an_atropos_environment_drives_a_run_that_resumes_after_sigkill_training_each_group_once(
        run_api, tiny_model, tmp_path, prefect_harness):
    from tests.cli_runs import kill_tree, run_cli_to_end, start_cli, wait_committed, wait_listed

    cfg = _atropos_config(tiny_model, str(tmp_path / "runs"), "atropos", iterations=5)
    store = RunStore(cfg["storage"]["root"], "atropos")
    proc, log = start_cli(cfg, tmp_path, "first")
    wait_listed(store, 2, "inbox.parquet", proc, log)
    # with max_staleness 1 iteration 2 can take its groups while iteration 0's checkpoint is still being written (CI
    # once killed it there, and the resumed run rightly started over): the kill waits for a committed checkpoint too
    wait_committed(store, proc, log)
    killed = kill_tree(proc)
    assert killed > 3  # the flow, Ray's processes, the API server and the environment, all gone
    committed_before = {it for it in range(5) if store.entry(it, "inbox.parquet") is not None}
    pulled_before = {n.removesuffix(".parquet") for n in store.list_files(INBOX) if n.endswith(".parquet")
                     and "/" not in n}
    text = run_cli_to_end(cfg, tmp_path, "resumed")
    assert "resuming atropos" in text and "started the API server" in text

    taken = []
    for it in range(5):
        entry = store.entry(it, "inbox.parquet")
        assert entry is not None and entry.meta["groups"] == 4, f"iteration {it} took {entry and entry.meta}"
        taken += entry.meta["items"]
        assert store.entry(it, "rollouts.parquet").rows == 0  # the run sampled nothing of its own
        rows = store.get_table(it, "inbox.parquet").to_pylist()
        assert all(set(r["response_mask"]) == {1} and r["sampler_id"] == -1 for r in rows)
        assert all(it - 1 <= r["policy_version"] <= it for r in rows), [r["policy_version"] for r in rows]
    assert len(taken) == len(set(taken)) == 20  # no group trained twice
    rejected = {n.removesuffix(".error.json") for n in store.list_files(REJECTED) if n.endswith(".error.json")}
    for name in pulled_before:  # what was pulled before the kill was trained on after it, or refused with a reason
        assert name in taken or name in rejected, name
    left = [n for n in store.list_files(INBOX) if "/" not in n]
    assert left == [], left
    metrics = pq.read_table(store.local_path("metrics.parquet")).to_pylist()
    trained = [m for m in metrics if m.get("loss") is not None and m["run_attempt"] == 1]
    assert trained and all(m["inbox_groups"] == 4 for m in trained)
    # a resumed iteration that had taken its groups trains on the same ones (inbox.parquet) and pulls nothing; the
    # others pull what the groups pulled before the kill, and still waiting in inbox/, do not cover
    redone = [m for m in trained if m["iteration"] in committed_before]
    assert redone and all(m["outside_groups"] == 0 for m in redone)
    fresh = [m for m in trained if m["iteration"] not in committed_before]
    fresh_items = {n for m in fresh for n in store.entry(m["iteration"], "inbox.parquet").meta["items"]}
    assert sum(m["outside_groups"] for m in fresh) == 4 * len(fresh) - len(fresh_items & pulled_before)
    env_log = (tmp_path / "runs" / "atropos" / "atropos" / "env0.log").read_text()
    assert env_log.count("==> start") == 2  # one environment per run attempt
