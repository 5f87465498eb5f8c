"""What the tasks of one flow run share: the config, the run folder, the long-lived engines, the scorer (and the
actors of its model rewards).

Created once per flow run; tasks receive it and never rebuild an engine. ``pending_checkpoint`` is the checkpoint
whose files are being written in the background and not yet committed; ``status`` is the run's status.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefect.utilities.annotations import quote

from grpo_core.run.checkpoint import PendingCheckpoint
from grpo_core.cluster.engines import Engines
from grpo_core.cluster.reward_models import RewardModels
from grpo_core.cluster.teacher import TeacherActors
from grpo_core.config import GRPOConfig
from grpo_core.outside.endpoint.server import EndpointServer
from grpo_core.pipeline.evaluation import EvalScorers, EvalSet
from grpo_core.pipeline.prompts import PromptStream
from grpo_core.rewards.scorer import Scorer
from grpo_core.run.status import RunStatus
from grpo_core.run.storage import RunStore


@dataclass
class RunContext:
    cfg: GRPOConfig
    store: RunStore
    engines: Engines
    scorer: Scorer
    train_prompts: PromptStream
    status: RunStatus
    eval_sets: list[EvalSet] = field(default_factory=list)   # the named eval sets, first set first
    eval_scorers: EvalScorers | None = None                  # an accuracy scorer per eval reward type
    reward_models: RewardModels | None = None                # the actors of reward.models (the scorer asks them)
    teacher: TeacherActors | None = None                     # the distillation teacher's actors (distill set)
    pending_checkpoint: PendingCheckpoint | None = None
    endpoint: EndpointServer | None = None  # the policy endpoint (endpoint in the config), once the engines are up
    started_at: float = field(default_factory=time.time)  # the flow run's start: stage timestamps count from it

    def clock(self) -> float:
        """Seconds since this flow run started (the ``<stage>_started_at`` / ``_ended_at`` metrics)."""
        return time.time() - self.started_at


_PLAIN = (str, int, float, bool, type(None), dict, list, tuple)


def _hidden(value: Any) -> Any:
    return value if isinstance(value, _PLAIN) else quote(value)


def _quoted(args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    return [_hidden(v) for v in args], {k: _hidden(v) for k, v in kwargs.items()}


class Opaque:
    """A task called with its context objects (RunContext, RunStore, the config, the status) hidden from Prefect's
    parameter introspection; the task receives them unchanged.

    Prefect walks every task argument recursively, twice per task run, looking for futures to wait on and to
    record as dependencies: dataclasses, pydantic models and their lists. A RunContext holding the eval sets'
    prompts took 70 ms a task run that way (the tiny task's whole iteration is 0.5 s); none of these objects ever
    holds a future. Plain values (iteration numbers, file names, a metrics row) still go through as they are, so
    task-run names can use them."""

    def __init__(self, task):
        self.task = task

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _quoted(args, kwargs)
        return self.task(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _quoted(args, kwargs)
        return self.task.submit(*args, **kwargs)
