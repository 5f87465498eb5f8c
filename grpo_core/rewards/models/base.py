"""The interface every model reward implements, and what it returns per row."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class RewardInput:
    """What a model reward sees of one row: the prompt's chat messages (the dataset's, without the run's system
    prompt or worked examples), the response, and the row's gold answer if it has one (reference-guided judges)."""

    messages: tuple[tuple[str, str], ...]   # (role, content) pairs
    response: str
    answer: str | None = None

    @property
    def question(self) -> str:
        """The last user turn: what a judge's template calls {question}."""
        return next((content for role, content in reversed(self.messages) if role == "user"), "")

    def chat(self) -> list[dict[str, str]]:
        """The prompt's messages followed by the response as the assistant's turn."""
        return [{"role": r, "content": c} for r, c in self.messages] + [{"role": "assistant",
                                                                          "content": self.response}]


@dataclass(frozen=True)
class ModelVerdict:
    """One row's outcome. ``value`` None means unscored, and ``error`` says why (too long, unparseable verdict, a
    server that never answered); ``raw`` is a judge's text, kept in scored.parquet."""

    value: float | None
    raw: str | None = None
    error: str | None = None


class ModelReward(ABC):
    """Loaded once (its model, its engine, its HTTP session), then asked for many batches."""

    @abstractmethod
    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        """One verdict per row, in order; a row that cannot be scored gets a verdict with an error, never a 0."""

    def close(self) -> None:
        """Release what the reward holds (an engine, a session)."""
