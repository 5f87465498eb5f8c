"""A Ray cluster across the hosts of a ``tests.netns.Topology``, with the run folder on an S3 host.

Each Ray node is started as an operator starts one on a machine of its own: ``ray start`` inside the host's
namespace with ``--node-ip-address`` set to the host's address and a temp folder of its own; the head on ``head``,
the others joining it. The S3 server (SeaweedFS, ``grpo_core.infra.s3server``) binds the S3 host's address only. The flow
driver is ``grpo train`` run inside the head's namespace, with a Prefect home of its own (its ephemeral API is on
the head's loopback).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.netns import Host, Topology, TopologyError

REPO = Path(__file__).resolve().parents[1]
RAY_PORT = 6379
BUCKET = "grpo"
RAY = str(Path(sys.executable).parent / "ray")
# What this project runs on a host, told by the command line: the flow driver, the engine actors (Ray titles them
# ray::EngineWorker), the S3 server. Everything else listening there is Ray's own (GCS, raylet, agents), which binds
# every address of its host (Ray 2.60 has no setting for it): in a namespace, the host's address and loopback.
OUR_PROCESSES = ("grpo_cli.main", "EngineWorker", "grpo_core.infra.s3server", "weed ")
# Every Ray worker process (the driver, each actor) serves Ray's core-worker RPC on a port from this range, on every
# address too; the range is Ray's default, given to `ray start` explicitly so that the test can tell those apart.
RAY_WORKER_PORTS = (10002, 19999)


def host_env(**extra: str) -> dict[str, str]:
    """The environment of a process started on a host: this one's (offline hub, caches in the project) without
    what only makes sense here (this process's Prefect API, Ray's loopback-only switch)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_", "PYTEST_", "RAY_AUTH_")) and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
    env.update(extra)
    return env


@dataclass
class RayNode:
    host: Host
    num_cpus: float
    resources: dict[str, float] = field(default_factory=dict)


class NetnsCluster:
    """Ray nodes on ``nodes`` (the first is the head), an S3 server on ``s3_host``."""

    def __init__(self, topology: Topology, workdir: Path, nodes: list[RayNode], s3_host: str):
        self.topology, self.workdir = topology, workdir
        self.nodes = {n.host.name: n for n in nodes}
        self.head = nodes[0].host
        self.s3_host = topology[s3_host]
        self.address = f"{self.head.address}:{RAY_PORT}"
        self.storage_options: dict | None = None
        self._starts: dict[str, int] = {}
        # Ray's session folders hold Unix sockets (paths under 108 bytes): a short folder of their own.
        self.ray_dir = Path(tempfile.mkdtemp(prefix="grpo-ray-"))
        # Ray's token authentication, as on a real cluster: every node and the driver read this cluster's token.
        self.token = workdir / "ray_token"
        self.token.write_text(os.urandom(32).hex() + "\n")
        self.token.chmod(0o600)

    def env(self, **extra: str) -> dict[str, str]:
        return host_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token), **extra)

    def remove_files(self) -> None:
        """Ray's session folders (once every process of the topology is gone)."""
        shutil.rmtree(self.ray_dir, ignore_errors=True)

    # --------------------------------------------------------------------------------------------- start
    def start(self) -> "NetnsCluster":
        self.start_s3()
        for name in self.nodes:
            self.start_node(name)
        self.wait_nodes()
        return self

    def start_s3(self) -> None:
        workdir = self.workdir / "s3"
        workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "s3.log"
        log.unlink(missing_ok=True)
        self.s3_host.popen([sys.executable, "-m", "grpo_core.infra.s3server", str(workdir), BUCKET,
                            "--host", self.s3_host.address], log, env=host_env())
        deadline = time.monotonic() + 60
        while "storage_options:" not in log.read_text():
            if time.monotonic() > deadline or "Error" in log.read_text():
                raise TopologyError(f"the S3 server on {self.s3_host.name} did not start:\n{log.read_text()}")
            time.sleep(0.1)
        line = next(li for li in log.read_text().splitlines() if li.startswith("storage_options:"))
        self.storage_options = json.loads(line.split(":", 1)[1])

    def start_node(self, name: str) -> None:
        """``ray start`` on host ``name`` (again after it was lost: a node with the same address and a new id)."""
        node = self.nodes[name]
        self._starts[name] = self._starts.get(name, 0) + 1
        temp = self.ray_dir / f"{name}-{self._starts[name]}"
        temp.mkdir(parents=True, exist_ok=True)
        argv = [RAY, "start", f"--node-ip-address={node.host.address}", f"--num-cpus={node.num_cpus:g}",
                f"--temp-dir={temp}", "--object-store-memory=150000000", "--disable-usage-stats",
                f"--min-worker-port={RAY_WORKER_PORTS[0]}", f"--max-worker-port={RAY_WORKER_PORTS[1]}"]
        if node.resources:
            argv.append(f"--resources={json.dumps(node.resources)}")
        if node.host is self.head:
            argv += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        else:
            argv.append(f"--address={self.address}")
        node.host.run(argv, env=self.env(), timeout=180)

    def alive_nodes(self) -> dict[str, str]:
        """{node address: node id} of the nodes the head counts alive."""
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
                "print('NODES ' + json.dumps({n['NodeManagerAddress']: n['NodeID'] for n in ray.nodes() "
                "if n['Alive']}))") % self.address
        out = self.head.run([sys.executable, "-c", code], env=self.env(), timeout=120).stdout
        return json.loads(next(li for li in out.splitlines() if li.startswith("NODES "))[6:])

    def wait_nodes(self, timeout: float = 120.0) -> dict[str, str]:
        """Until every node is alive (each host's address listed); returns {address: node id}."""
        wanted = {n.host.address for n in self.nodes.values()}
        deadline = time.monotonic() + timeout
        while True:
            alive = self.alive_nodes()
            if wanted <= set(alive):
                return alive
            if time.monotonic() > deadline:
                raise TopologyError(f"nodes {sorted(wanted - set(alive))} did not join in {timeout:.0f}s")
            time.sleep(1.0)

    def restore(self) -> None:
        """Bring back every node that was lost (a test that killed one leaves the cluster whole again)."""
        alive = self.alive_nodes()
        for name, node in self.nodes.items():
            if node.host.address not in alive:
                node.host.kill_all()
                self.start_node(name)
        self.wait_nodes()

    # ----------------------------------------------------------------------------------------------- runs
    def config(self, base: dict) -> dict:
        """``base`` (a tests.conftest.tiny_config tree) with the run folder on the S3 host and the driver joining
        this cluster."""
        cfg = json.loads(json.dumps(base))
        cfg["storage"] = {"root": f"s3://{BUCKET}/runs", "options": self.storage_options}
        cfg.setdefault("cluster", {})["ray_address"] = self.address
        return cfg

    def train(self, config: dict, name: str) -> tuple[subprocess.Popen, Path]:
        """Start ``grpo train`` on the head with ``config``; returns the process and its log."""
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.workdir / f"{name}.log"
        env = self.env(PREFECT_HOME=str(self.workdir / f"prefect-{name}"))
        proc = self.head.popen([sys.executable, "-m", "grpo_cli.main", "train", "--config", str(path)], log,
                               env=env, cwd=REPO)
        return proc, log
