"""The engine actors of one flow run behind one object: tasks call methods here and never touch Ray.

Why: the flow must survive an engine actor that dies (OOM kill, segfault, node lost). Every call goes through
``_call``, which turns Ray's actor-death errors into ``EngineLost`` naming the actor, its pid and node, so the flow
can recreate the actor and restore it from the latest checkpoint without knowing Ray. Placement (which actors,
where) is decided here too; today one colocated actor holds the sampler and the learner.
"""
from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from grpo_core.checkpoint import CheckpointRef
from grpo_core.cluster.ray_cluster import create_policy_worker, kill, start_ray, stop_ray
from grpo_core.config import GRPOConfig


class EngineLost(RuntimeError):
    """An engine actor died; the message says which one, where, and what Ray reported."""


class EngineStartError(RuntimeError):
    """An engine actor could not be created (its constructor raised): retrying would fail the same way."""


class Engines:
    def __init__(self, cfg: GRPOConfig):
        self.cfg = cfg
        self._policy = None
        self.info: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> dict[str, Any]:
        """Start (or join) Ray and create the actors; returns the policy actor's start-up figures."""
        start_ray(self.cfg)
        return self._create()

    def _create(self) -> dict[str, Any]:
        self._policy = create_policy_worker(self.cfg)
        self.info = self._call("info")
        return self.info

    def recreate(self) -> dict[str, Any]:
        """Replace a dead (or live) policy actor by a fresh one holding the initial weights."""
        if self._policy is not None:
            kill(self._policy)
        started = time.perf_counter()
        info = self._create()
        info["recreate_s"] = time.perf_counter() - started
        return info

    def close(self) -> None:
        if self._policy is not None:
            kill(self._policy)
            self._policy = None
        stop_ray()

    def describe(self) -> str:
        return f"policy actor (pid {self.info.get('pid', '?')} on {self.info.get('host', '?')})"

    def _call(self, method: str, *args, **kwargs):
        try:
            return ray.get(getattr(self._policy, method).remote(*args, **kwargs))
        except RayActorError as exc:
            if exc.actor_init_failed:  # its constructor raised: a start-up error, not a lost engine
                raise EngineStartError(f"starting the policy actor failed: {exc}") from exc
            lines = [line.strip() for line in str(exc).strip().splitlines()]
            detail = [line for line in lines if line.startswith(("pid:", "ip:"))] + lines[-1:]
            raise EngineLost(f"{self.describe()} died during {method}: {'; '.join(detail)}") from exc

    # ----------------------------------------------------------------------------------------------- stages
    def versions(self) -> tuple[int, int]:
        """(sampler version, learner version)."""
        return tuple(self._call("versions"))

    def rollout(self, iteration: int, prompts: list[dict[str, Any]], name: str, seed_offset: int) -> dict[str, Any]:
        return self._call("rollout", iteration, prompts, name=name, seed_offset=seed_offset)

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool,
                      samples: int) -> dict[str, Any]:
        return self._call("generate_eval", iteration, prompts, greedy, samples)

    def train(self, iteration: int) -> dict[str, Any]:
        return self._call("train", iteration)

    def sync(self) -> dict[str, float]:
        return self._call("sync")

    def check_sync(self, iteration: int, name: str, rows: int) -> dict[str, float]:
        return self._call("check_sync", iteration, name, rows)

    def serve_checkpoint(self, model_dir: str, version: int) -> float:
        return self._call("serve_checkpoint", model_dir, version)

    def weights_digest(self) -> str:
        return self._call("weights_digest")

    # ------------------------------------------------------------------------------------------ checkpoints
    def checkpoint_begin(self, iteration: int) -> dict[str, Any]:
        return self._call("checkpoint_begin", iteration)

    def checkpoint_result(self, wait: bool = False) -> dict[str, Any] | None:
        return self._call("checkpoint_result", wait)

    def restore(self, ref: CheckpointRef) -> dict[str, Any]:
        return self._call("restore", {"iteration": ref.iteration, "policy_version": ref.policy_version,
                                      "path": ref.path})

    def save_final(self) -> dict[str, Any]:
        return self._call("save_final")
