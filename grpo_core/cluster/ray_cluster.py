"""Ray placement: the only module that imports ray.

A local Ray binds 127.0.0.1 only (tests and `make run` never listen on an external address). Actors get their
thread count and cache folders through ``runtime_env``: Ray sets OMP_NUM_THREADS=1 in workers, and vLLM turns
``torch.set_num_threads`` into a no-op, so the environment is the only reliable knob.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any

import psutil
import torch

# grpo_core/cluster/__init__.py has set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER before this import (loopback addresses).
import ray  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from grpo_core.config import GRPOConfig, RoleResources  # noqa: E402
from grpo_core.run.logs import LOGS  # noqa: E402
from grpo_core.infra.netaddr import local_address_towards  # noqa: E402
from grpo_core.run.storage import RunStore  # noqa: E402

# Environment every actor inherits: offline hub, caches inside the project, in-process vLLM on loopback.
_PASSTHROUGH = ("TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH", "DS_BUILD_OPS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
PLACEMENT_TIMEOUT_S = 120.0
# Starts of a local Ray whose node did not come up in time (Ray's own message, node.py).
_RAY_STARTS = 3
_NODE_START_TIMED_OUT = "timed out during startup"
logger = logging.getLogger(__name__)


def on_loopback(cfg: GRPOConfig) -> bool:
    """Whether the run's Ray is on this machine's loopback: a local Ray of its own or a head at 127.0.0.1."""
    address = cfg.cluster.ray_address
    return not address or address.split(":")[0] in ("127.0.0.1", "localhost")


def driver_address(ray_address: str) -> str | None:
    """This machine's address facing the Ray head at ``ray_address`` (``host:port``); None for "auto" (a cluster
    started on this machine: Ray finds it and its address) and for Ray Client (``ray://``: no raylet here)."""
    if ray_address == "auto" or ray_address.startswith("ray://"):
        return None
    host = ray_address.rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1" if host in ("127.0.0.1", "localhost") else local_address_towards(host)


def actor_env(threads: int, local: bool) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
    env.update({
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    })
    if local:  # one machine: gloo's sockets on loopback only (its default follows the hostname)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # Without CUDA, torch.compile does nothing an actor needs. vLLM compiles two small helpers of its sampler
        # (the rank of each sampled token, computed whenever logprobs are asked for, so on every request here; a
        # random-sampling workaround): each new actor traced them with Dynamo at its first request (a first
        # `generate` 3.3 s against 0.45 s eager, on 2 cores), and in a new Python environment Inductor also built
        # its C++ header with g++ (a fresh clone's first `make run`: iteration 0 16 s against 3.8 s). Eager, the
        # rank helper makes a (tokens x vocabulary) boolean temporary, small beside the logprobs it reads; on GPUs,
        # where vLLM's comment warns of that copy, actors keep torch.compile.
        if not torch.cuda.is_available():
            env.setdefault("TORCH_COMPILE_DISABLE", "1")
    return env


def start_ray(cfg: GRPOConfig) -> bool:
    """Connect to ``cluster.ray_address`` or start a local, loopback-only Ray; False when this process is already
    connected to a Ray (a caller's ``ray.init``, as in a notebook or the test suite), which is then used as it is
    and left running at the end.

    A local Ray gets at least as many logical CPUs as the placement reserves: on a small machine the roles take
    turns (a synchronous iteration samples, then trains), so oversubscribing cores is the expected use."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cfg.cluster.ray_address:
        # The driver joins as the node it runs on, named by its address facing the head: 127.0.0.1 for a head on
        # loopback (`grpo stack up`), else the interface the kernel routes to the head through. Ray's own guess is
        # the hostname's address or 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set by this package), which on
        # a multi-homed node or in a network namespace is not where that node's raylet listens.
        ray.init(address=cfg.cluster.ray_address, log_to_driver=cfg.logging.verbose,
                 _node_ip_address=driver_address(cfg.cluster.ray_address))
        return True
    roles = cfg.placement.roles(cfg.cluster) + [("reward", sum(m.replicas for m in cfg.reward.models.values()),
                            cfg.cluster.reward_resources)]
    wanted = sum(count * res.num_cpus for _, count, res in roles)
    custom: dict[str, float] = {}
    for _, count, res in roles:
        for key, amount in res.resources.items():
            custom[key] = custom.get(key, 0.0) + count * amount
    start_local_ray(max(os.cpu_count() or 1, math.ceil(wanted)), custom, log_to_driver=cfg.logging.verbose)
    return True


# Ray starts idle Python workers for the first driver (as many as it may start at once, up to the node's CPUs), each
# importing Ray: a few CPU-seconds apiece, taken from the engines' start on 2 cores. No actor here uses them: every
# engine and model actor has environment variables of its own (a runtime_env), so Ray starts a worker for it anyway.
_NO_PRESTARTED_WORKERS = {"prestart_worker_first_driver": False}


def start_local_ray(num_cpus: int, resources: dict[str, float] | None = None, log_to_driver: bool = False) -> None:
    """A new Ray cluster of this process's own, on 127.0.0.1 only ("local": without it ray.init joins any cluster
    a `ray start` or another run left on this machine; cluster.ray_address="auto" joins that one on purpose).

    On a loaded machine Ray's node can fail to come up: the raylet waits a fixed 15 s for its Python agents to
    write their ports (ray-project/ray#65983), and their imports alone can take longer when every core is busy.
    Such a start is cleaned up (the processes it left) and tried again, up to ``_RAY_STARTS`` times."""
    resources = {key: math.ceil(total) for key, total in (resources or {}).items()}  # a node's are whole numbers
    for start in range(1, _RAY_STARTS + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            ray.init(address="local", num_cpus=num_cpus, resources=resources or None, include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=log_to_driver, configure_logging=False,
                     _system_config=_NO_PRESTARTED_WORKERS)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for it; anything else is re-raised
            if _NODE_START_TIMED_OUT not in str(exc) or start == _RAY_STARTS:
                raise
            logger.warning("Ray's node did not come up (start %d of %d: %s); starting it again", start, _RAY_STARTS,
                         exc)
            ray.shutdown()
            _stop_processes([p for p in psutil.Process().children(recursive=True) if p.pid not in before])


def _stop_processes(processes: list[psutil.Process], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s``."""
    for p in processes:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


def leftovers() -> list[str]:
    """What runs in this process's Ray cluster now: live actors and placement groups not yet removed (a run that
    ended leaves none). Read from the GCS, so it works without Ray's dashboard."""
    from ray._private import state
    from ray.util import placement_group_table

    actors = [f"actor {a.get('ActorClassName') or a_id} ({a.get('State')})" for a_id, a in state.actors().items()
              if a.get("State") != "DEAD"]
    groups = [f"placement group {g.get('name') or pg_id} ({g.get('state')})"
              for pg_id, g in placement_group_table().items() if g.get("state") != "REMOVED"]
    return actors + groups


def _bundle(res: RoleResources) -> dict[str, float]:
    bundle = {"CPU": res.num_cpus, **res.resources}
    if res.num_gpus:
        bundle["GPU"] = res.num_gpus
    return bundle


def placed_group(res: RoleResources, count: int, name: str, role: str):
    """A ready placement group of ``count`` bundles of ``res``; a clear error after PLACEMENT_TIMEOUT_S when the
    cluster cannot hold it (instead of waiting forever).

    Samplers are spread over the nodes that can hold them (best effort: on one node they pack), so that losing a
    node loses as few of them as possible and each gets a node's cores; learner ranks (and colocated actors) pack,
    their collectives faster within a node."""
    strategy = "SPREAD" if role == "sampler" else "PACK"
    group = placement_group([_bundle(res)] * count, strategy=strategy, name=name)
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise RuntimeError(
            f"Ray cannot place {count} {role} actor(s) of {_bundle(res)} each within {PLACEMENT_TIMEOUT_S:.0f}s; "
            f"the cluster has {ray.available_resources()} available (cluster.{role if role != 'policy' else 'learner'}"
            f"_resources, cluster.samplers/learners)") from None
    return group


def actor_output_file(cfg: GRPOConfig, name: str) -> str | None:
    """Where an engine actor's stdout and stderr go: ``logs/<name>.log`` of a local run folder, unless
    ``logging.verbose`` (then Ray forwards them to the terminal) or the run store is remote (Ray's session logs)."""
    if cfg.logging.verbose:
        return None
    return RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options).local_path(f"{LOGS}/{name}.log")


def create_engine_actors(cfg: GRPOConfig) -> tuple[list, list, list]:
    """The engine actors of the placement, not yet set up: (samplers, learners, placement groups). Colocated
    actors appear in both lists. Each role is gang-placed with a placement group, which fails with a clear message
    when the cluster cannot hold it instead of waiting forever. Single-threaded actors on purpose: two concurrent
    ``generate`` calls corrupt an in-process vLLM engine."""
    from grpo_core.engine.worker import EngineWorker

    actor_cls = ray.remote(EngineWorker)
    local = on_loopback(cfg)
    samplers, learners, groups = [], [], []
    for role, count, res in cfg.placement.roles(cfg.cluster):
        group = placed_group(res, count, f"grpo-{cfg.run_name}-{role}", role)
        groups.append(group)
        threads = res.torch_threads or os.cpu_count() or 1
        for i in range(count):
            handle = actor_cls.options(
                num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources or None,
                max_restarts=0, max_concurrency=1, name=None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                     placement_group_bundle_index=i),
                runtime_env={"env_vars": actor_env(threads, local)},
            ).remote(cfg, sampler_id=i if role in ("policy", "sampler") else None,
                     learner_rank=i if role in ("policy", "learner") else None,
                     output_file=actor_output_file(cfg, f"{role}-{i}"))
            if role in ("policy", "sampler"):
                samplers.append(handle)
            if role in ("policy", "learner"):
                learners.append(handle)
    return samplers, learners, groups


def group_placed(group) -> bool:
    """Whether every bundle of ``group`` sits on a live node now: after a node is lost, Ray moves its bundles to
    another node that can hold them (state RESCHEDULING until one can)."""
    from ray.util import placement_group_table

    return placement_group_table(group).get("state") == "CREATED"


def create_sampler_actor(cfg: GRPOConfig, sampler_id: int, group, bundle_index: int) -> Any:
    """A sampler actor in a bundle of a placement group: a dead one's (replacement) or a new group's (scale-up)."""
    from grpo_core.engine.worker import EngineWorker

    res = cfg.cluster.sampler_resources
    return ray.remote(EngineWorker).options(
        num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources or None, max_restarts=0,
        max_concurrency=1,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                             placement_group_bundle_index=bundle_index),
        runtime_env={"env_vars": actor_env(res.torch_threads or os.cpu_count() or 1, on_loopback(cfg))},
    ).remote(cfg, sampler_id=sampler_id, learner_rank=None, output_file=actor_output_file(cfg, f"sampler-{sampler_id}"))


def node_ip(handle) -> str:
    """The address of the node an actor runs on."""
    return ray.get(handle.__ray_call__.remote(lambda _self: ray.util.get_node_ip_address()))


def node_ids(handles: list) -> list[tuple[str, str]]:
    """The Ray node id and node address of each actor."""
    return ray.get([h.__ray_call__.remote(
        lambda _self: (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())) for h in handles])


def remove_groups(groups: list) -> None:
    for group in groups:
        remove_placement_group(group)


def call(handle_method, *args, **kwargs):
    """Call an actor method and wait for its result (errors raise here, with the actor's traceback)."""
    return ray.get(handle_method.remote(*args, **kwargs))


def kill(handle) -> None:
    ray.kill(handle, no_restart=True)
