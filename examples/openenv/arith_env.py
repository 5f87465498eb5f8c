"""An OpenEnv environment for the built-in addition task: openenv-core's own ``Environment`` / ``Action`` /
``Observation`` / ``State`` types and a ``Rubric`` for the reward, nothing of the trainer. ``reset(seed=...)`` poses
the question of the data row that the seed picks (the same seed, the same question: how a group is formed),
``step`` takes the policy's answer, ends the episode and scores it: 1 when the last ``\\boxed{}`` holds the sum.

It runs as any OpenEnv environment does: in-process (what ``grpo_outside/openenv_driver.py`` does with it, in
.venv-envs), or behind openenv's server (``openenv.core.env_server.create_app(make_env, ArithAction,
ArithObservation)``). The data are local (``data/arith/train.jsonl``; $ARITH_DATA to change): no hub.
"""
from __future__ import annotations

import json
import os
import random
from functools import lru_cache
from typing import Any, Callable, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric
from pydantic import Field


class ArithAction(Action):
    text: str = Field(..., description="the policy's whole answer")


class ArithObservation(Observation):
    prompt: str = ""  # the question, on reset; empty once answered
    answer_given: Optional[str] = None


class ArithState(State):
    expected: Optional[str] = None
    row: Optional[int] = None


def last_boxed(text: str) -> Optional[str]:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 1, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


class BoxedAnswer(Rubric):
    """1.0 when the last ``\\boxed{}`` of the answer is the expected one, else 0.0."""

    def __init__(self, expected: Callable[[], Optional[str]]):
        super().__init__()
        self.expected = expected

    def forward(self, action: ArithAction, observation: ArithObservation) -> float:
        given = last_boxed(action.text)
        return 1.0 if given is not None and given.strip() == self.expected() else 0.0


@lru_cache(maxsize=4)
def _rows(path: str) -> tuple[dict, ...]:
    with open(path) as f:
        return tuple(json.loads(line) for line in f if line.strip())


class ArithEnvironment(Environment[ArithAction, ArithObservation, ArithState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, path: str | None = None):
        super().__init__()
        self.rows = _rows(path or os.environ.get("ARITH_DATA", "data/arith/train.jsonl"))
        self._state = ArithState(episode_id=str(uuid4()), step_count=0)
        self.rubric = BoxedAnswer(lambda: self._state.expected)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> ArithObservation:
        self._reset_rubric()
        row = random.Random(seed).randrange(len(self.rows))
        data = self.rows[row]
        user = data["messages"] if isinstance(data["messages"], dict) else data["messages"][-1]
        self._state = ArithState(episode_id=episode_id or str(uuid4()), step_count=0,
                                 expected=str(data["gt_answer"]), row=row)
        return ArithObservation(prompt=user["content"], done=False, reward=None, metadata={"row": row})

    def step(self, action: ArithAction, timeout_s: Optional[float] = None, **kwargs: Any) -> ArithObservation:
        self._state.step_count += 1
        observation = ArithObservation(answer_given=last_boxed(action.text), done=True)
        observation.reward = self._apply_rubric(action, observation)
        return observation

    @property
    def state(self) -> ArithState:
        return self._state


def make_env() -> ArithEnvironment:
    return ArithEnvironment()
