"""The interface every distillation teacher implements, and what it sees and returns per row."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class TeacherInput:
    """One sampled row: the student's prompt tokens, the dataset's prompt messages (what a teacher with a context of
    its own renders its prompt from) and the response tokens to score."""

    prompt_token_ids: tuple[int, ...]
    messages: tuple[tuple[str, str], ...]   # (role, content) pairs, without the run's system prompt or examples
    response_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class TeacherScores:
    """The teacher's view of one row's response: ``logprobs[t]`` is log pi_teacher(response[t] | context,
    response[:t]) and ``top_ids[t]`` the token it finds most likely there (for the agreement metric). Asked for its
    top K (``distill.top_k``): ``top_k_ids[t]`` its K most likely tokens at position t, most likely first, and
    ``top_k_logprobs[t]`` their logprobs (empty when not asked)."""

    logprobs: tuple[float, ...]
    top_ids: tuple[int, ...]
    top_k_ids: tuple[tuple[int, ...], ...] = ()
    top_k_logprobs: tuple[tuple[float, ...], ...] = ()


class Teacher(ABC):
    """Loaded once, then asked for many batches."""

    @abstractmethod
    def score(self, rows: list[TeacherInput]) -> list[TeacherScores]:
        """One ``TeacherScores`` per row, in order, as long as the row's response."""

    def close(self) -> None:
        """Release what the teacher holds."""
