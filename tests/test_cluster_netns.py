"""Several hosts for real: a Ray cluster whose nodes are network namespaces with their own addresses on a bridge
(tests.netns), the run folder on an S3 host, and faults injected into it mid-run.

Topology (made by the module's fixture, removed after it, nothing left behind):

    head      10.213.N.2  Ray head (GCS) and the flow driver (`grpo train`, its Prefect API on the head's loopback)
    learner   10.213.N.3  Ray node with resource learner_node: the DeepSpeed learner
    sampler1  10.213.N.4  Ray node with resource sampler_node: a vLLM sampler
    sampler2  10.213.N.5  Ray node with resource sampler_node: a vLLM sampler
    s3        10.213.N.6  SeaweedFS: the run folder (checkpoints, weights/ for the files transport)

Every run is the same training (split placement, 2 samplers, 1 learner rank, seed 0) as a reference run on one
machine's loopback, and must end with bit-identical weights to it: the network, the hosts and the faults may change
when things happen, never what is computed. `make test-cluster` runs them all (as root); figures (times to detect
and recover, iterations lost) are printed and appended to .cache/cluster-figures.jsonl. CI (`make test-e2e`) runs the
broadcast run and the sampler host killed mid-rollout; the others take about 10 minutes more.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load

from grpo_core.run.storage import RunStore
from tests.conftest import REPO, tiny_config
from tests.netns import Host, Topology, available
from tests.netns_cluster import BUCKET, OUR_PROCESSES, RAY_WORKER_PORTS, NetnsCluster, RayNode
from tests.watchers import actor_runs

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

HOSTS = ["head", "learner", "sampler1", "sampler2", "s3"]
ITERATIONS = 4
FIGURES = REPO / ".cache" / "cluster-figures.jsonl"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = available()
    if reason is not None:
        pytest.skip(f"no several-host topology on this machine: {reason}")
    work = tmp_path_factory.mktemp("netns")
    with Topology(HOSTS) as topo:
        nodes = [RayNode(topo["head"], 1), RayNode(topo["learner"], 2, {"learner_node": 1}),
                 RayNode(topo["sampler1"], 2, {"sampler_node": 1}), RayNode(topo["sampler2"], 2, {"sampler_node": 1})]
        cluster = NetnsCluster(topo, work, nodes, "s3")
        try:
            yield cluster.start()
        finally:
            topo.down()
            cluster.remove_files()
    # leaving the Topology killed every process on it and checked that no namespace, link or process is left


def _training(tiny_model: str, run_name: str, transport: str = "broadcast", **overrides) -> dict:
    """The training every run here does: split placement, 2 samplers spread over the sampler hosts, 1 learner rank
    on the learner host, a checkpoint every 2 iterations."""
    return tiny_config(tiny_model, "unused", run_name=run_name, iterations=ITERATIONS, eval__interval=0,
                       checkpoint__interval=2, rollout__temperature=1.0, cluster__placement="split",
                       cluster__samplers=2, weights__transport=transport,
                       cluster__sampler_resources={"num_cpus": 0.5, "resources": {"sampler_node": 0.01}},
                       cluster__learner_resources={"num_cpus": 1, "resources": {"learner_node": 0.01}},
                       **overrides)


LEARNING = ("iteration", "policy_version", "reward_mean", "loss", "grad_norm", "response_length_mean")


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory, prefect_harness) -> dict:
    """The same training on one machine (a local Ray on loopback, the run folder on local disk)."""
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("one-node")
    cfg = _training(tiny_model, "reference")
    cfg["storage"] = {"root": str(root)}
    grpo_train(config=cfg)
    store = RunStore(str(root), "reference")
    return {"weights": load(store.get_bytes("final/model.safetensors")),
            "rows": [{k: r.get(k) for k in LEARNING} for r in store.read_metrics().to_pylist()]}


def _store(cluster: NetnsCluster, run: str) -> RunStore:
    return RunStore(f"s3://{BUCKET}/runs", run, cluster.storage_options)


def _assert_same_training(cluster: NetnsCluster, run: str, reference: dict) -> list[dict]:
    """``run`` recorded every iteration with the reference's learning figures and ended on its exact weights."""
    store = _store(cluster, run)
    rows = store.read_metrics().to_pylist()
    assert [{k: r.get(k) for k in LEARNING} for r in rows] == reference["rows"]
    weights = load(store.get_bytes("final/model.safetensors"))
    assert weights.keys() == reference["weights"].keys()
    differing = [k for k in weights if not torch.equal(weights[k], reference["weights"][k])]
    assert not differing, f"final weights differ from the one-machine run in {differing}"
    for r in rows:
        assert r["sync_logprob_max_diff"] is not None and r["sync_logprob_max_diff"] < 1e-4, r
    return rows


def _finish(proc, log: Path, timeout: float = 1200) -> str:
    rc = proc.wait(timeout=timeout)
    text = log.read_text()
    assert rc == 0, text[-6000:]
    return text


def _record(name: str, figures: dict) -> None:
    line = {"test": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    print(f"cluster figures: {json.dumps(line)}")
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with open(FIGURES, "a") as fh:
        fh.write(json.dumps(line) + "\n")


class LogWatch:
    """When each of some lines first appeared in a run's log (monotonic seconds), watched from a thread."""

    def __init__(self, log: Path, patterns: dict[str, str]):
        self.log, self.patterns, self.seen = log, patterns, {}
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.seen) < len(self.patterns):
            text = self.log.read_text() if self.log.exists() else ""
            now = time.monotonic()
            for key, pattern in self.patterns.items():
                if key not in self.seen and pattern in text:
                    self.seen[key] = now
            time.sleep(0.05)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        return self.seen


def _engine_worker(host: Host, timeout: float = 600) -> psutil.Process:
    """The engine actor process on ``host`` (Ray titles it ``ray::EngineWorker``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in host.pids():
            try:
                p = psutil.Process(pid)
                if "EngineWorker" in " ".join(p.cmdline()):
                    return p
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    raise AssertionError(f"no engine actor appeared on {host.name}")


def _when_busy(proc, store: RunStore, after_iteration: int, host: Host, method: str, timeout: float = 600) -> float:
    """Wait until ``after_iteration`` is recorded, then until the engine actor on ``host`` runs ``method`` (its
    process title ``ray::EngineWorker.<method>``). Returns the monotonic time it was seen busy."""
    deadline = time.monotonic() + timeout
    while not _recorded(store, after_iteration):
        assert proc.poll() is None, "the run ended before the fault"
        assert time.monotonic() < deadline, f"iteration {after_iteration} was not recorded in time"
        time.sleep(0.05)
    worker = _engine_worker(host)
    while time.monotonic() < deadline:
        if actor_runs(worker, method):
            return time.monotonic()
        time.sleep(0.001)
    raise AssertionError(f"the engine actor on {host.name} never ran {method}")


def _recorded(store: RunStore, iteration: int) -> bool:
    try:
        return iteration in store.read_metrics().column("iteration").to_pylist()
    except (OSError, KeyError):
        return False


def _hosts_by_role(cluster: NetnsCluster, run: str) -> dict[str, str]:
    status = _store(cluster, run).get_json_file("status.json")
    by_address = {h.address: h.name for h in cluster.topology.hosts.values()}
    return {a["role"]: by_address[a["address"]] for a in status["actors"]}


def _start_until_busy(cluster: NetnsCluster, tiny_model: str, run: str, watch: dict[str, str], host: str,
                      after_iteration: int, method: str):
    """Start ``run``, watch its log for ``watch``'s lines, and return once the engine actor on ``host`` runs
    ``method`` after ``after_iteration`` is recorded: (process, log, watch, that host, the monotonic time)."""
    proc, log = cluster.train(cluster.config(_training(tiny_model, run)), run)
    watching = LogWatch(log, watch)
    victim = cluster.topology[host]
    return proc, log, watching, victim, _when_busy(proc, _store(cluster, run), after_iteration, victim, method)


def _assert_dropped_and_readded(rows: list[dict]) -> None:
    """Iteration 1's rollout lost a sampler and a later sync brought one back; none is out at the end."""
    assert [r["samplers_lost"] for r in rows] == [0, 1, 0, 0]
    assert sum(r["samplers_replaced"] for r in rows) == 1 and rows[-1]["samplers_out"] == 0


# ---------------------------------------------------------------------------------------------------- tests

# The broadcast run is the part of the module CI runs (`make test-e2e`; about 6.5 minutes with set-up on 2 cores):
# the cluster's one end-to-end check, as every long demo target keeps one. `make test-cluster` runs them all.
@pytest.mark.parametrize("transport", [pytest.param("broadcast", marks=pytest.mark.e2e), "files"])
def test_trains_across_hosts_exactly_as_on_one_machine(cluster, reference, tiny_model, transport):
    """Roles land on their hosts by custom resources, weights cross the bridge (gloo broadcast from the learner
    host, or files through the S3 host), and the run ends on the one-machine run's exact weights. While it runs,
    no process of ours listens beyond its host's address and loopback, and the learner's stores listen on the
    learner host's address. Ray's own servers listen on every address of their host (Ray 2.60 has no setting):
    its daemons, and the core-worker RPC port (from Ray's worker port range) inside every Ray worker process."""
    run = f"across-{transport}"
    proc, log = cluster.train(cluster.config(_training(tiny_model, run, transport)), run)
    store = _store(cluster, run)
    _when_busy(proc, store, 0, cluster.topology["learner"], "train")
    listening = {name: host.listeners() for name, host in cluster.topology.hosts.items()}
    _finish(proc, log)
    for name, sockets in listening.items():
        own = cluster.topology[name].address
        for address, port, command in sockets:
            ray_rpc = RAY_WORKER_PORTS[0] <= port <= RAY_WORKER_PORTS[1] and "weed" not in command
            if any(mark in command for mark in OUR_PROCESSES) and not ray_rpc:
                assert address in (own, "127.0.0.1"), f"{command[:80]} on {name} listens on {address}:{port}"
    learner = cluster.topology["learner"].address
    # the learners' rendezvous (and, with broadcast, the weight-transfer group's store) on the learner's address
    assert any(a == learner and "EngineWorker" in c for a, _, c in listening["learner"]), listening["learner"]
    hosts = _hosts_by_role(cluster, run)
    assert hosts == {"sampler 0": hosts["sampler 0"], "sampler 1": hosts["sampler 1"], "learner rank 0": "learner"}
    assert {hosts["sampler 0"], hosts["sampler 1"]} == {"sampler1", "sampler2"}  # spread, one per host
    _assert_same_training(cluster, run, reference)
    assert bool(store.list_dirs("weights")) == (transport == "files"), "only the files transport publishes"


def test_a_sampler_host_killed_mid_rollout(cluster, reference, tiny_model):
    """sampler2's machine is lost (every process on it SIGKILLed) in the middle of iteration 1's rollout: its
    prompts are redone by the other sampler, a replacement sampler starts on the host that can hold it (sampler1)
    and catches up through S3, no iteration is lost and the weights stay exact."""
    run = "sampler-host-lost"
    proc, log, watch, victim, killed_at = _start_until_busy(
        cluster, tiny_model, run, {"detected": "died during rollout", "replaced": "replaced sampler"}, "sampler2", 0,
        "sample")
    killed = victim.kill_all()
    text = _finish(proc, log)
    seen = watch.stop()
    assert "detected" in seen and "replaced" in seen, text[-4000:]
    rows = _assert_same_training(cluster, run, reference)
    _assert_dropped_and_readded(rows)
    for it in range(ITERATIONS):
        assert _store(cluster, run).get_table(it, "rollouts.parquet").num_rows == 8 * 4
    hosts = _hosts_by_role(cluster, run)
    assert set(hosts.values()) == {"sampler1", "learner"}, hosts  # the replacement runs beside the survivor
    _record("sampler host killed mid-rollout", {
        "processes_killed": killed, "detect_s": round(seen["detected"] - killed_at, 2),
        "replaced_s": round(seen["replaced"] - killed_at, 2), "iterations_lost": 0})
    cluster.restore()


def test_the_learner_host_lost_then_back(cluster, reference, tiny_model):
    """The learner's machine is lost while it trains iteration 2: the flow sees the learner die, recreates the
    engine actors (the learner's placement waits until a node with learner_node is back: the host rejoins 10 s
    after the loss), restores the latest checkpoint from S3 and ends on the one-machine run's exact weights."""
    run = "learner-host-lost"
    proc, log, watch, victim, killed_at = _start_until_busy(
        cluster, tiny_model, run, {"detected": "died during", "recovered": "recreated the engine actors"}, "learner", 1,
        "train")
    killed = victim.kill_all()
    time.sleep(10)
    cluster.start_node("learner")
    back_at = time.monotonic()
    text = _finish(proc, log)
    seen = watch.stop()
    assert "detected" in seen and "recovered" in seen, text[-4000:]
    rows = _assert_same_training(cluster, run, reference)
    continued = int(text.split("; continuing at iteration ")[1].split()[0])
    assert continued in (0, 2), text[-4000:]  # from iter-000001's checkpoint (or the start, if not yet committed)
    assert {r["run_attempt"] for r in rows} == {rows[0]["run_attempt"]}  # recovered inside the same flow run
    _record("learner host lost, back after 10 s", {
        "processes_killed": killed, "detect_s": round(seen["detected"] - killed_at, 2),
        "node_back_s": round(back_at - killed_at, 2), "recovered_s": round(seen["recovered"] - killed_at, 2),
        "iterations_lost": 2 - continued + 1})
    cluster.wait_nodes()


def test_a_sampler_host_partitioned_for_30_seconds(cluster, reference, tiny_model):
    """sampler1's link goes down in the middle of iteration 1's rollout and comes back 30 s later. Whether Ray
    declares the node dead within those 30 s depends on its health checks (5 missed: from about 15 s when the cut
    host's address stops answering at all, to about 65 s when its packets are only lost), so the run either waits
    for the sampler and continues with it, or drops it (its prompts redone by the other sampler) and re-adds a
    replacement where a node can hold it. The metrics say which; either way nothing hangs (the iteration ends
    within the partition + Ray's detection + a replacement's start) and the weights are the one-machine run's."""
    run = "sampler-partitioned"
    proc, log, watch, victim, cut_at = _start_until_busy(
        cluster, tiny_model, run, {"dropped": "died during rollout", "replaced": "replaced sampler"}, "sampler1", 0,
        "sample")
    victim.cut()
    try:
        time.sleep(30)
    finally:
        victim.heal()
    _finish(proc, log)
    seen = watch.stop()
    rows = _assert_same_training(cluster, run, reference)
    stalled = rows[1]["time_total_s"]
    assert stalled < 30 + 65 + 60, f"iteration 1 took {stalled:.0f}s"
    if "dropped" in seen:  # Ray declared the node dead: the sampler was dropped, then re-added
        _assert_dropped_and_readded(rows)
        assert "replaced" in seen
        outcome = {"outcome": "dropped and re-added", "detect_s": round(seen["dropped"] - cut_at, 2),
                   "replaced_s": round(seen["replaced"] - cut_at, 2)}
    else:  # the node outlived the partition: the rollout waited for it
        assert all(r["samplers_lost"] == 0 and r["samplers_replaced"] == 0 for r in rows)
        assert rows[1]["time_rollout_s"] > 30, [r["time_rollout_s"] for r in rows]
        outcome = {"outcome": "waited"}
    cluster.restore()  # a node Ray declared dead has stopped itself
    _record("sampler host partitioned 30 s", {"partition_s": 30, **outcome,
                                              "iteration_with_partition_s": round(stalled, 2),
                                              "iteration_s_median_others": round(statistics.median(
                                                  r["time_total_s"] for r in rows[2:]), 2), "iterations_lost": 0})


def test_slow_lossy_links_everywhere(cluster, reference, tiny_model):
    """Every host's outgoing packets are held 200 ms and 1% of them dropped (a round trip takes 400 ms or more):
    the run still finishes, every sync check holds and the weights are the one-machine run's."""
    run = "slow-lossy"
    hosts = list(cluster.topology.hosts.values())
    try:
        for host in hosts:
            host.shape(delay_ms=200, loss=0.01, workdir=cluster.workdir)
        started = time.monotonic()
        proc, log = cluster.train(cluster.config(_training(tiny_model, run)), run)
        _finish(proc, log, timeout=1500)
        wall = time.monotonic() - started
    finally:
        for host in hosts:
            host.unshape()
    rows = _assert_same_training(cluster, run, reference)
    _record("200 ms + 1% loss on every link", {
        "run_wall_s": round(wall, 1), "iteration_s_median": round(statistics.median(r["time_total_s"] for r in rows), 2),
        "sync_s_median": round(statistics.median(r["time_sync_s"] for r in rows), 2)})
