"""Wall seconds of an iteration's stages, measured where each stage runs (as verl's ``marked_timer``), so the
iteration's timing columns are arithmetic on named figures rather than on loose timestamps."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StageTimer:
    """``with timer("train"): ...`` adds the block's wall seconds to ``timer["train"]`` (0 for a stage never
    timed); ``timer.total()`` is the seconds since the timer was made."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + time.perf_counter() - started

    def __getitem__(self, stage: str) -> float:
        return self._seconds.get(stage, 0.0)

    def total(self) -> float:
        return time.perf_counter() - self._started
