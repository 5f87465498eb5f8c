"""The answers the SDK polls for: every mutating route returns ``{"request_id"}`` at once, the work runs behind it,
and ``retrieve_future`` long-polls for the result.

A result is JSON (most types), protobuf bytes (``forward_backward`` and ``sample``: the SDK reads those as
protobuf only), or a failure ``{"error", "category"}``. The poll holds at most ``POLL_SECONDS`` (the SDK's own
timeout is 45 s) and then answers "try again", which the SDK retries at once and quietly (408).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

POLL_SECONDS = 25.0
KEEP_SECONDS = 3600.0  # results are kept this long after they are ready (a client that lost one polls again)


@dataclass
class Outcome:
    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"


class _Entry:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome: Outcome | None = None
        self.finished_at = 0.0
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []


class FutureTable:
    """Request ids -> outcomes; thread-safe (the work finishes on worker threads, the polls come from the server)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def open(self) -> str:
        with self._lock:
            self._forget_old()
            request_id = str(next(self._ids))
            self._entries[request_id] = _Entry()
        return request_id

    def settle(self, request_id: str, outcome: Outcome) -> None:
        entry = self._entries[request_id]
        with self._lock:
            entry.outcome, entry.finished_at = outcome, time.monotonic()
            entry.done.set()
            waiters, entry.waiters = entry.waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)

    def run(self, request_id: str, work: Callable[[], Outcome], failed: Callable[[Exception], Outcome]) -> None:
        """Settle ``request_id`` with ``work()``, or with ``failed(exc)`` if it raises."""
        try:
            outcome = work()
        except Exception as exc:  # noqa: BLE001 - every failure is the request's answer, never the worker's death
            outcome = failed(exc)
        self.settle(request_id, outcome)

    def known(self, request_id: str) -> bool:
        return request_id in self._entries

    async def wait_async(self, request_id: str, seconds: float = POLL_SECONDS) -> Outcome | None:
        """The outcome, or None if it is not ready within ``seconds`` (KeyError for an unknown id), awaited on the
        event loop, holding no thread: with the server's 40 worker threads each held by a waiting poll, 64
        concurrent samples' polls would leave no thread to read the next request."""
        entry = self._entries[request_id]
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if entry.done.is_set():
                return entry.outcome
            entry.waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, seconds)
        except asyncio.TimeoutError:
            with self._lock:
                if (loop, future) in entry.waiters:
                    entry.waiters.remove((loop, future))
            return entry.outcome if entry.done.is_set() else None
        return entry.outcome

    def _forget_old(self) -> None:
        horizon = time.monotonic() - KEEP_SECONDS
        for key in [k for k, e in self._entries.items() if e.done.is_set() and e.finished_at < horizon]:
            del self._entries[key]


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
