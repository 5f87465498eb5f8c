"""The environment interface of multi-turn rollouts: what an episode's environment sees and answers.

An environment is a plain Python class, one instance per episode (its attributes are the episode's state). The
episode opens with the dataset row's prompt (its messages rendered by the run's chat template, as in single-turn
rollouts); ``reset`` receives the row's columns. After each assistant turn ``step`` gets the turn's text and answers
with the next messages (a tool's output, a user's reply, a game's state) or ends the episode, optionally with a
reward. The runner (``grpo_core.envs.runner``) owns tokens, budgets and timeouts: an environment never sees or makes
token ids, so the policy's tokens are never re-tokenised.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One tool call of an assistant turn, as recorded in the episode: the tool's input and what came back."""

    name: str
    input: str
    output: str
    error: str | None = None  # the tool failed, timed out or printed too much (the output says so too)
    seconds: float = 0.0


@dataclass
class Step:
    """An environment's answer to one assistant turn.

    messages: chat messages appended before the next assistant turn (``{"role": "tool"|"user", "content": ...}``);
        ignored when ``done``.
    done: the episode ends after this turn.
    reward: the episode's reward, when the environment decides it (``reward.rewards: [env]`` reads it); None: left
        to the scorer, which scores the last assistant turn like a single-turn response.
    reason: why the episode ended (recorded in ``episode_end``), e.g. "answered".
    tool_calls: the calls this turn made, for the records and the metrics.
    """

    messages: list[dict[str, str]] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    reason: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


class Environment(ABC):
    """One episode. Subclasses implement ``step``; ``reset`` is optional.

    Constructed with the keyword arguments of ``env.args`` in the config. ``max_turns`` caps the assistant turns of
    an episode (the config's ``env.max_turns`` overrides the class's value when set).
    """

    max_turns: int = 4

    def reset(self, row: dict[str, Any]) -> None:
        """Start an episode on a dataset row (its columns: ``gt_answer``, ``test_cases``, ...)."""

    @abstractmethod
    def step(self, assistant_text: str) -> Step:
        """The answer to one assistant turn (its decoded text, special tokens removed)."""
