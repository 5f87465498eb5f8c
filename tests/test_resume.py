"""Resume after failure, on the real stack with the tiny model.

One uninterrupted run is the reference. Every other run here is hurt in one way (the flow's whole process tree
SIGKILLed between stages or mid-training, a checkpoint left half-written, the policy actor killed, a config
changed, the run folder's S3 server stopped for 10 s) and must end with bit-identical final weights, the same
learning metrics, one row per iteration, and the same prompts drawn (the difficulty pool's state restored from the
checkpoint).
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_core.run import checkpoint
from grpo_core.run.storage import RunStore
from tasks.checkpoint import POOL_FILE
from tests.cli_runs import (
    api_env, kill_tree, learning_rows, run_cli_to_end, start_cli, stop_once_listed, weights_differing,
)
from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ITERATIONS = 6
# Two optimizer steps per iteration (2 mini-batches), so a kill after scoring lands inside a multi-step update.
# The prompts drawn by the difficulty pool from ten train prompts, four an iteration: the untrained policy gets most
# groups all wrong, so later iterations pass prompts over, and every resume here restores the pool's state too.
SHAPE = dict(iterations=ITERATIONS, rollout__prompts_per_iteration=4, rollout__samples_per_prompt=4,
             train__mini_batch_size=8, train__micro_batch_size=8, train__lr=1e-3, eval__interval=3,
             eval__max_prompts=8, checkpoint__interval=2, checkpoint__keep_last=2,
             data__train_path=str(REPO / "tests/data/arith-train-10.jsonl"), data__sampler="difficulty_pool")
# Columns that describe learning (timings and bookkeeping differ between runs by nature).
LEARNING = ("iteration", "policy_version", "reward_mean", "accuracy_mean", "loss", "grad_norm", "lr", "clipfrac",
            "approx_kl", "entropy", "response_length_mean", "eval_accuracy", "pool_active", "pool_easy", "pool_hard",
            "pool_skipped", "rollout_tokens")


def _config(tiny_model: str, root: Path, run_name: str, **extra) -> dict:
    return tiny_config(tiny_model, str(root), run_name=run_name, **{**SHAPE, **extra})


def _final_weights(root: Path, run: str) -> dict[str, torch.Tensor]:
    return load_file(str(root / run / "final" / "model.safetensors"))


def _learning_rows(root: Path, run: str) -> list[dict]:
    return learning_rows(root, run, LEARNING)


def _assert_same_run(root: Path, run: str, ref_root: Path, ref_run: str) -> None:
    differing = weights_differing(root, run, ref_root, ref_run)
    assert not differing, f"final weights differ from the uninterrupted run in {differing}"
    assert _learning_rows(root, run) == _learning_rows(ref_root, ref_run)
    iterations = [r["iteration"] for r in _learning_rows(root, run)]
    assert iterations == list(range(ITERATIONS + 1)), "exactly one metrics row per iteration (+ the final eval)"
    assert _prompts_drawn(root, run) == _prompts_drawn(ref_root, ref_run)


def _prompts_drawn(root: Path, run: str) -> list[list[str]]:
    store = RunStore(str(root), run)
    return [sorted(store.get_table(i, "rollouts.parquet").column("prompt_id").unique().to_pylist())
            for i in range(ITERATIONS)]


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("reference")
    result = grpo_train(config=_config(tiny_model, root, "ref"))
    assert result["resumed_from"] is None
    rows = _learning_rows(root, "ref")
    assert sum(r["pool_skipped"] or 0 for r in rows) > 0, rows  # the pool did pass prompts over
    return root


def _check_resumed(text: str, store: RunStore, run: str, resumes: list[checkpoint.CheckpointRef]) -> None:
    """``text``: the last start's output; ``resumes``: the checkpoint each resume started from, in order. Each start
    redid the iterations after the checkpoint it resumed from (run_attempt: 0 the first start, +1 per resume)."""
    last = resumes[-1]
    assert f"resuming {run} from {last.name}, policy version {last.policy_version}" in text, text
    rows = store.read_metrics().to_pylist()
    assert [r["run_attempt"] for r in rows] == [sum(c.next_iteration <= r["iteration"] for c in resumes)
                                                for r in rows]


def test_sigkill_between_stages_then_mid_training_then_resume_is_exact(reference, tiny_model, tmp_path):
    """The flow's whole process tree SIGKILLed twice, each start resuming the run folder the last one left:
    first after iteration 3's rollout is committed, before it is scored (a checkpoint half-written later than the
    last committed one is planted too: the resume must ignore it and use the committed one); then, in the resumed
    run, as soon as iteration 4's batch is scored, with the learner inside its update (two optimizer steps). The
    third start ends the run, which must equal the uninterrupted one, although its policy actor is SIGKILLed once
    iteration 5 is scored (that start recreates the actor and goes on from its last checkpoint, in the same flow)."""
    cfg = _config(tiny_model, tmp_path, "cut")
    store = RunStore(str(tmp_path), "cut")
    proc, log = start_cli(cfg, tmp_path, "first")
    stop_once_listed(store, proc, log, 3, "rollouts.parquet", near=(2, "train.json"))
    kill_tree(proc)
    assert store.entry(3, "scored.parquet") is None, "the kill was meant to land between rollout and score"
    first = checkpoint.latest(store)
    assert first.iteration == 1, first  # iter-000003 is only started after iteration 3's sync
    pool = store.get_json_file(f"{first.path}/{POOL_FILE}")  # the pool's state, in the checkpoint's manifest
    assert pool["iteration"] == 1 and len(pool["selection"]) == 4
    assert POOL_FILE in store.get_json_file(f"{first.path}/{checkpoint.MANIFEST}")["files"]
    # A checkpoint killed mid-write: its files are there (one cut short), its manifest is not.
    half = tmp_path / "cut" / checkpoint.checkpoint_path(2)
    shutil.copytree(tmp_path / "cut" / first.path, half)
    (half / checkpoint.MANIFEST).unlink()
    weights = half / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    proc, log = start_cli(cfg, tmp_path, "second")
    stop_once_listed(store, proc, log, 4, "scored.parquet", near=(4, "rollouts.parquet"))
    kill_tree(proc)
    assert store.entry(4, "train.json") is None, "the kill was meant to land inside iteration 4's update"
    _check_resumed(log.read_text(), store, "cut", [first])  # up to iteration 3's row: 4's was not recorded
    second = checkpoint.latest(store)  # iter-000003, or iter-000001 if the kill beat iter-000003's commit
    assert second.iteration in (1, 3), second

    stop = threading.Event()
    killed = _kill_policy_actor_when(store, 5, "scored.parquet", stop)  # only the third start scores iteration 5
    try:
        text = run_cli_to_end(cfg, tmp_path, "third")
    finally:
        stop.set()
    assert killed, "the watcher never found the policy actor"
    assert "recreated the engine actors (1/" in text, text
    _check_resumed(text, store, "cut", [first, second])
    _assert_same_run(tmp_path, "cut", reference, "ref")
    if second.iteration == 3:  # iteration 4's rollouts were sampled with the checkpoint's weights: reused
        assert store.entry(4, "rollouts.parquet").meta["policy_version"] == second.policy_version
    assert checkpoint.latest(store).iteration == ITERATIONS - 1
    assert [r.iteration for r in checkpoint.complete_checkpoints(store)] == [3, 5]  # keep_last=2
    assert not half.exists()  # the leftover of the interrupted write was pruned


def test_a_changed_config_is_refused_naming_the_fields(reference, tiny_model, tmp_path, capsys):
    """`grpo train` refuses before Prefect or Ray start (the command's own function, in this process)."""
    from grpo_cli.main import main as grpo

    cfg = _config(tiny_model, reference, "ref", train__lr=5e-4, rollout__temperature=0.7)
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert grpo(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rollout.temperature: 1.0 -> 0.7" in err and "train.lr: 0.001 -> 0.0005" in err, err
    assert "seed" not in err


def test_a_finished_run_is_not_redone(reference, tiny_model, tmp_path):
    from flows.grpo_train import grpo_train

    root = tmp_path / "runs"
    shutil.copytree(reference / "ref", root / "ref")
    before = _final_weights(root, "ref")
    again = grpo_train(config=_config(tiny_model, root, "ref"))
    assert "already finished" in again["summary"][0]
    assert all(torch.equal(before[k], v) for k, v in _final_weights(root, "ref").items())


@pytest.mark.e2e  # make test: test_a_finished_run_is_not_redone, and the resumes of test_sigkill_between_stages...
def test_more_iterations_extend_a_finished_run(reference, tiny_model, tmp_path):
    from flows.grpo_train import grpo_train

    root = tmp_path / "runs"
    shutil.copytree(reference / "ref", root / "ref")
    extended = grpo_train(config=_config(tiny_model, root, "ref", iterations=ITERATIONS + 2))
    assert extended["resumed_from"] == f"iter-{ITERATIONS - 1:06d}"
    rows = RunStore(str(root), "ref").read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS + 3))
    assert rows[ITERATIONS]["reward_mean"] is not None  # a real iteration now, not the old final evaluation
    assert RunStore(str(root), "ref").read_config()["iterations"] == ITERATIONS + 2


def _kill_policy_actor_when(store: RunStore, iteration: int, name: str, stop: threading.Event) -> list[int]:
    """Background watcher: SIGKILL the policy actor's process once ``name`` of ``iteration`` is committed."""
    killed: list[int] = []

    def watch() -> None:
        while not stop.is_set() and store.entry(iteration, name) is None:
            time.sleep(0.005)
        if stop.is_set():
            return
        for p in psutil.Process().children(recursive=True):
            try:
                if "EngineWorker" in " ".join(p.cmdline()):
                    p.send_signal(signal.SIGKILL)
                    killed.append(p.pid)
            except psutil.NoSuchProcess:
                pass

    threading.Thread(target=watch, daemon=True).start()
    return killed


def _run_until_it_gives_up(tiny_model, tmp_path) -> checkpoint.CheckpointRef:
    """A run whose policy actor is killed with cluster.max_actor_restarts=0: it must fail saying what died and
    where to resume from."""
    from flows.grpo_train import RunFailed, grpo_train

    store = RunStore(str(tmp_path), "giveup")
    stop = threading.Event()
    killed = _kill_policy_actor_when(store, 4, "rollouts.parquet", stop)
    try:
        with pytest.raises(RunFailed) as info:
            grpo_train(config=_config(tiny_model, tmp_path, "giveup", cluster__max_actor_restarts=0))
    finally:
        stop.set()
    assert killed
    message = str(info.value)
    assert "colocated sampler 0 + learner rank 0 (pid" in message and "died during" in message, message
    latest = checkpoint.latest(store)  # iter-000001 is committed before iteration 4 starts (iter-000003 may be)
    assert latest is not None and "max_actor_restarts=0" in message and latest.path in message, message
    status = store.get_json_file("status.json")
    assert status["state"] == "failed" and "RunFailed" in status["error"]
    return latest


@pytest.mark.e2e  # make test: the in-flow recovery (above) and the resumes of test_sigkill_between_stages...
def test_giving_up_then_prefect_flow_run_retry_resumes_the_run_folder(reference, tiny_model, tmp_path):
    """After the in-flow recoveries are spent the flow run fails naming where to resume; the failed flow run itself
    (same id, same parameters) re-executed by `prefect flow-run retry`, as the UI's Retry button does for a
    deployment's run, resumes the run folder and ends exactly as the reference."""
    import asyncio

    from prefect.client.orchestration import get_client

    latest = _run_until_it_gives_up(tiny_model, tmp_path)

    async def failed_run_id():
        async with get_client() as client:
            runs = await client.read_flow_runs(limit=200)
        ours = [fr for fr in runs if (fr.parameters.get("config") or {}).get("run_name") == "giveup"
                and fr.parameters["config"]["storage"]["root"] == str(tmp_path)]
        assert len(ours) == 1 and ours[0].state.is_failed(), ours
        return str(ours[0].id)

    run_id = asyncio.run(failed_run_id())
    out = subprocess.run([str(Path(sys.executable).parent / "prefect"), "flow-run", "retry", run_id,
                          "--entrypoint", "flows/grpo_train.py:grpo_train"], cwd=REPO, env=api_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert f"resuming giveup from {latest.name}" in text, text
    _assert_same_run(tmp_path, "giveup", reference, "ref")


@pytest.mark.e2e
def test_s3_outage_of_10s_mid_run_is_survived_and_nothing_is_lost(reference, tiny_model, s3_server,
                                                                   tmp_path_factory):
    """The run folder on a real S3 server (SeaweedFS on loopback) that stops for 10 s during iteration 2 and comes
    back with its data: stage I/O fails, Prefect retries the tasks with backoff, and the run ends exactly as the
    uninterrupted local run."""
    import pyarrow.parquet as pq
    import s3fs
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.grpo_train import grpo_train
    from grpo_core.data.schemas import ROLLOUT_FIELDS, SCORE_FIELDS, check_schema
    from grpo_core.infra.s3server import start_s3_server

    # A server of its own: the session's shared one must not go down under other tests.
    server = start_s3_server(tmp_path_factory.mktemp("s3-outage"), buckets=["outage"])
    root = "s3://outage/runs"
    store = RunStore(root, "s3run", server.storage_options)
    down_for, outage, finished = 10.0, {}, threading.Event()

    def cut_the_service() -> None:
        while not finished.is_set() and store_has(2, "rollouts.parquet") is False:
            time.sleep(0.02)
        server.stop()
        outage["down_at"] = time.monotonic()
        time.sleep(down_for)
        server.restart()
        outage["up_at"] = time.monotonic()
        finished.wait()  # the server dies with the thread that started it (parent-death signal): keep it alive

    def store_has(iteration: int, name: str) -> bool:
        try:
            return store.entry(iteration, name) is not None
        except OSError:
            return False

    watcher = threading.Thread(target=cut_the_service, daemon=True)
    watcher.start()
    try:
        # One HTTP attempt per s3fs try: the client's own retries give up within about 2 s, so the stage I/O that
        # meets the outage fails and Prefect's task retries have to carry the run. With botocore's default retries
        # a call could ride out the 10 s by itself, and whether one did depended on timing.
        # Each request bounded (botocore waits 60 s for an answer by default): a server that stalls costs a retry,
        # not minutes.
        options = {**server.storage_options,
                   "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 5, "read_timeout": 30}}
        cfg = _config(tiny_model, Path("unused"), "s3run", storage__root=root,
                      storage__options=options, storage__retry_delay_s=1.0, storage__retries=6)
        result = grpo_train(config=cfg)
        assert outage.get("up_at", 0) - outage.get("down_at", 0) >= down_for, outage
        assert result["run"] == f"{root}/s3run"
        b = load_file_from_s3(server, "outage/runs/s3run/final/model.safetensors")
        a = _final_weights(reference, "ref")
        assert all(torch.equal(a[k], b[k]) for k in a), "S3 run's final weights differ from the local run's"
        rows = [{k: r.get(k) for k in LEARNING} for r in store.read_metrics().to_pylist()]
        assert rows == _learning_rows(reference, "ref")
        assert store.list_complete_iterations(required=["rollouts", "scored", "train"]) == list(range(ITERATIONS))

        # Prefect retried the tasks that met the outage (shown as retries in the UI).
        import asyncio

        async def task_runs():
            async with get_client() as client:
                flow_runs = await client.read_flow_runs(limit=200)
                ids = [fr.id for fr in flow_runs if (fr.parameters.get("config") or {}).get("run_name") == "s3run"]
                return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))

        retried = [tr for tr in asyncio.run(task_runs()) if tr.run_count > 1]
        assert retried, "no task run was retried during the outage"

        # Read back independently through s3fs + pyarrow: the documented schemas.
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options)
        base = "outage/runs/s3run"
        rollouts = pq.read_table(f"{base}/iter-000002/rollouts.parquet", filesystem=fs)
        check_schema(rollouts, ROLLOUT_FIELDS, "rollouts.parquet on S3")
        scored = pq.read_table(f"{base}/iter-000002/scored.parquet", filesystem=fs)
        check_schema(scored, ROLLOUT_FIELDS + SCORE_FIELDS, "scored.parquet on S3")
        assert scored.num_rows == rollouts.num_rows == 4 * 4
        assert fs.exists(f"{base}/curves.png") and fs.exists(f"{base}/latest.json")
        assert checkpoint.latest(store).iteration == ITERATIONS - 1
    finally:
        finished.set()
        server.stop()


def load_file_from_s3(server, key: str) -> dict[str, torch.Tensor]:
    import s3fs
    from safetensors.torch import load

    return load(s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options).cat_file(key))
