"""A pool of long-lived scoring worker processes that kills and replaces a worker stuck on one row.

Why not ``concurrent.futures`` / ``multiprocessing.Pool``: neither can stop one task that hangs (sympy stuck in C code
ignores alarms), and a dead worker breaks a ``ProcessPoolExecutor`` for good. Here each worker has its own pipe and
scores the rows it was sent one after another, answering row by row, so the pool always knows which row a worker is
on and since when. A worker past ``hard_timeout_s`` on one row is killed with its process group (any sandbox it
started included) and replaced; that row comes back as ``LostRow``, the rows queued behind it go to other workers.

Workers start once (``spawn``: safe inside processes that run threads) and serve every ``run`` call.
"""
from __future__ import annotations

import collections
import math
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from grpo_core.rewards.worker import ComponentOutcome, WorkerSpec, worker_main

MAX_CHUNK = 16


class ScorerError(RuntimeError):
    """The worker pool itself failed (a worker could not start, or a fatal error such as no sandbox)."""


class FatalWorkerError(ScorerError):
    """A worker hit an error no row can get past; ``error_type`` names the original exception class."""

    def __init__(self, error_type: str, message: str):
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.detail = message


@dataclass(frozen=True)
class LostRow:
    """A row whose worker had to be killed (``timed_out``) or died on its own while scoring it."""
    reason: str
    timed_out: bool


RowOutput = dict[str, ComponentOutcome] | LostRow


class _Worker:
    def __init__(self, context: Any, spec: WorkerSpec, index: int):
        self.connection, child_end = context.Pipe(duplex=True)
        self.process = context.Process(target=worker_main, args=(child_end, spec),
                                       name=f"grpo-scorer-{index}", daemon=False)
        self.process.start()
        child_end.close()
        self.started_at = time.monotonic()
        self.ready = False
        self.outstanding: collections.deque[int] = collections.deque()
        self.head_started = 0.0

    def kill(self) -> None:
        """Kill the worker and its process group (sandboxes it started), then reap it."""
        if self.process.pid is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # not yet its own group leader, or already gone
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


class WorkerPool:
    """``num_workers`` scoring processes for one WorkerSpec; ``run`` scores a batch, ``close`` stops them."""

    def __init__(self, spec: WorkerSpec, num_workers: int, hard_timeout_s: float, start_timeout_s: float = 120.0):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.spec = spec
        self.hard_timeout_s = hard_timeout_s
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._spawned = 0
        self._workers: list[_Worker] = []
        self.replaced = 0   # workers killed or found dead and replaced, over the pool's life
        try:
            self._workers = [self._spawn() for _ in range(num_workers)]
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> _Worker:
        worker = _Worker(self._context, self.spec, self._spawned)
        self._spawned += 1
        return worker

    def _wait_until_ready(self) -> None:
        while not all(worker.ready for worker in self._workers):
            self._check_start_deadline()
            waiting = [w for w in self._workers if not w.ready]
            wait([w.connection for w in waiting] + [w.process.sentinel for w in waiting], timeout=1.0)
            for worker in waiting:
                if worker.connection.poll():
                    self._handle_message(worker, worker.connection.recv(), results=None)
                elif not worker.process.is_alive():
                    raise ScorerError(f"scorer worker exited with code {worker.process.exitcode} while starting")

    def _check_start_deadline(self) -> None:
        now = time.monotonic()
        for worker in self._workers:
            if not worker.ready and now - worker.started_at > self.start_timeout_s:
                raise ScorerError(f"scorer worker not ready after {self.start_timeout_s:g}s")

    def run(self, items: list[tuple[str, dict[str, Any]]]) -> list[RowOutput]:
        """Score ``(completion, row)`` items; results in input order. A pool error leaves fresh workers behind."""
        if not self._workers:
            raise ScorerError("the scorer is closed")
        results: list[RowOutput | None] = [None] * len(items)
        pending = collections.deque(range(len(items)))
        chunk = max(1, min(MAX_CHUNK, math.ceil(len(items) / (4 * len(self._workers)))))
        try:
            while pending or any(w.outstanding for w in self._workers):
                self._dispatch(items, pending, chunk)
                self._wait_and_collect(pending, results)
        except BaseException:
            self._restart_all()
            raise
        return results  # type: ignore[return-value]  (every slot was filled: the loop ends only then)

    def _dispatch(self, items: list[tuple[str, dict[str, Any]]], pending: collections.deque[int], chunk: int) -> None:
        now = time.monotonic()
        for worker in self._workers:
            if not worker.ready:
                continue
            while pending and len(worker.outstanding) < 2 * chunk:
                batch = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                if not worker.outstanding:
                    worker.head_started = now
                worker.outstanding.extend(batch)
                worker.connection.send(("rows", [(i, items[i][0], items[i][1]) for i in batch]))

    def _wait_and_collect(self, pending: collections.deque[int], results: list[RowOutput | None]) -> None:
        now = time.monotonic()
        deadlines = [w.head_started + self.hard_timeout_s for w in self._workers if w.outstanding]
        timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
        wait([w.connection for w in self._workers] + [w.process.sentinel for w in self._workers], timeout=timeout)
        for index, worker in enumerate(self._workers):
            alive = self._drain(worker, results)
            if not alive:
                code = worker.process.exitcode
                self._replace(index, pending, results, LostRow(
                    f"scorer worker died while scoring this row (exit code {code})", timed_out=False))
            elif worker.outstanding and time.monotonic() - worker.head_started > self.hard_timeout_s:
                self._replace(index, pending, results, LostRow(
                    f"scoring exceeded the hard limit of {self.hard_timeout_s:g}s; worker killed", timed_out=True))
        self._check_start_deadline()

    def _drain(self, worker: _Worker, results: list[RowOutput | None]) -> bool:
        """Read every message waiting from a worker; False when the worker is gone."""
        try:
            while worker.connection.poll():
                self._handle_message(worker, worker.connection.recv(), results)
        except (EOFError, OSError):
            return False
        return worker.process.is_alive()

    def _handle_message(self, worker: _Worker, message: tuple, results: list[RowOutput | None] | None) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "init_failed":
            if message[2] is not None:
                raise FatalWorkerError(message[2], message[3])
            raise ScorerError(f"scorer worker failed to start: {message[1]}")
        elif kind == "row" and results is not None:
            item_id = worker.outstanding.popleft()
            if item_id != message[1]:
                raise ScorerError(f"scorer worker answered row {message[1]} while row {item_id} was expected")
            results[item_id] = message[2]
            worker.head_started = time.monotonic()
        elif kind == "fatal":
            raise FatalWorkerError(message[2], message[3])
        else:
            raise ScorerError(f"unexpected message from a scorer worker: {kind!r}")

    def _replace(self, index: int, pending: collections.deque[int], results: list[RowOutput | None],
                 lost: LostRow) -> None:
        worker = self._workers[index]
        worker.kill()
        if not worker.ready:
            raise ScorerError(f"scorer worker died while starting (exit code {worker.process.exitcode})")
        if worker.outstanding:
            results[worker.outstanding.popleft()] = lost
            pending.extendleft(reversed(worker.outstanding))
        self._workers[index] = self._spawn()
        self.replaced += 1

    def _restart_all(self) -> None:
        for index, worker in enumerate(self._workers):
            worker.kill()
            self._workers[index] = self._spawn()

    def close(self) -> None:
        """Stop every worker (politely, then by force). Safe to call twice."""
        for worker in self._workers:
            try:
                worker.connection.send(("stop",))
            except (OSError, ValueError):
                pass  # already gone
        deadline = time.monotonic() + 5.0
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()
        self._workers = []
