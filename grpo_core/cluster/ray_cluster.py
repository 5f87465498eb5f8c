"""Ray placement: the only module that imports ray.

A local Ray binds 127.0.0.1 only (tests and `make run` never listen on an external address). Actors get their
thread count and cache folders through ``runtime_env``: Ray sets OMP_NUM_THREADS=1 in workers, and vLLM turns
``torch.set_num_threads`` into a no-op, so the environment is the only reliable knob.
"""
from __future__ import annotations

import os
from typing import Any

# Ray reads this when it is imported: "0" makes a local Ray use 127.0.0.1 as its node address (the default is the
# machine's external address, so its servers would listen there). Set it to 1 in the environment for a multi-node
# cluster.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
import ray  # noqa: E402

from grpo_core.config import GRPOConfig

# Environment every actor inherits: offline hub, caches inside the project, in-process vLLM on loopback.
_PASSTHROUGH = ("TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH", "DS_BUILD_OPS")


def actor_env(threads: int) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
    env.update({
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false", "MASTER_ADDR": "127.0.0.1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    })
    return env


def start_ray(cfg: GRPOConfig) -> dict[str, Any]:
    """Connect to ``cluster.ray_address`` or start a local, loopback-only Ray. Returns the cluster resources."""
    if ray.is_initialized():
        return ray.cluster_resources()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cfg.cluster.ray_address:
        ray.init(address=cfg.cluster.ray_address, log_to_driver=True)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=True, configure_logging=False)
    return ray.cluster_resources()


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


def create_policy_worker(cfg: GRPOConfig):
    """The colocated actor (sampler + learner), created once per flow run. Single-threaded on purpose: two
    concurrent ``generate`` calls corrupt an in-process vLLM engine."""
    from grpo_core.policy_worker import PolicyWorker

    threads = cfg.cluster.torch_threads or os.cpu_count() or 1
    actor_cls = ray.remote(PolicyWorker)
    return actor_cls.options(num_cpus=cfg.cluster.num_cpus, max_restarts=0, max_concurrency=1,
                             runtime_env={"env_vars": actor_env(threads)}).remote(cfg)


def call(handle_method, *args, **kwargs):
    """Call an actor method and wait for its result (errors raise here, with the actor's traceback)."""
    return ray.get(handle_method.remote(*args, **kwargs))


def kill(handle) -> None:
    ray.kill(handle, no_restart=True)
