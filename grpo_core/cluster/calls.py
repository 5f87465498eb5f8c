"""Calls on several engine actors at once, and what their deaths become: the handles' shared plumbing.

Why here: the learner group, the sampler fleet and the weight sync all fan a call out over actors and must fail as
soon as one of them fails (a dead peer would leave the others waiting in a collective), naming the actor, its pid
and node. ``ActorNames`` is the one record of what each actor is, shared by the handles.
"""
from __future__ import annotations

from typing import Any, Callable

import ray
from ray.exceptions import RayActorError


class EngineLost(RuntimeError):
    """An engine actor died; the message says which one, where, and what Ray reported."""


class EngineStartError(RuntimeError):
    """An engine actor could not be created (its constructor or set-up raised): retrying would fail the same way."""


class ActorNames:
    """What each actor of the run is ("sampler 1 (pid 123 on host, node 10.0.0.2)"), for errors and logs."""

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}

    def set(self, actor: Any, name: str) -> None:
        self._names[actor] = name

    def forget(self, actor: Any) -> None:
        self._names.pop(actor, None)

    def of(self, actor: Any) -> str:
        return self._names.get(actor, "an engine actor")

    def clear(self) -> None:
        self._names.clear()


def gather(refs: list, actors: list, what: str, names: ActorNames, starting: bool = False) -> list:
    """Results of calls on several actors (one ref per actor, in order), failing as soon as one of them fails:
    ``EngineStartError`` while ``starting`` (or when its constructor failed), else ``EngineLost``."""
    results: dict[int, Any] = {}
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        i = index[ready[0]]
        try:
            results[i] = ray.get(ready[0])
        except RayActorError as exc:
            who = names.of(actors[i])
            if exc.actor_init_failed or starting:
                raise EngineStartError(f"starting {who} failed during {what}: {exc}") from exc
            lines = [line.strip() for line in str(exc).strip().splitlines()]
            detail = [line for line in lines if line.startswith(("pid:", "ip:"))] + lines[-1:]
            raise EngineLost(f"{who} died during {what}: {'; '.join(detail)}") from exc
    return [results[i] for i in range(len(refs))]


def on_each(actors: list, call: Callable[[Any], Any], what: str, names: ActorNames) -> list:
    """``call(actor)`` (an actor method's ``.remote(...)``) on every actor of ``actors``; ``what`` names it in
    errors."""
    return gather([call(a) for a in actors], actors, what, names)


def last_line(exc: BaseException) -> str:
    """The last line of an error's message (Ray's carry the remote traceback above it)."""
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
