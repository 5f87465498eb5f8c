"""The scorer's worker process: scores one row at a time in its own main thread, under a per-row time alarm.

Why a process and its main thread: math-verify (and sympy under it) can run for a very long time on hostile LaTeX,
and its own timeouts rely on ``signal.alarm``, which only works in a main thread. Each worker arms an interval timer
around every component; the alarm raises ``ComponentTimeout`` (a BaseException, so library code that catches
``Exception`` cannot swallow it). Work stuck in C code ignores the alarm: for that the parent kills the whole worker
(see ``pool.py``).

Protocol over a ``multiprocessing`` pipe (all tuples):
    parent -> worker: ("rows", [(item_id, completion, row), ...])  |  ("stop",)
    worker -> parent: ("ready",)  |  ("init_failed", message, fatal error type or None, error text)
                      ("row", item_id, {component: ComponentOutcome})  |  ("fatal", item_id, kind, message)
A "fatal" is an error that no row can get past (no sandbox can start): the parent raises it.
"""
from __future__ import annotations

import logging
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

from grpo_core.infra.child_process import die_with_parent

ACCURACY = "accuracy"


class ComponentTimeout(BaseException):
    """Raised by the worker's alarm when one component of one row exceeds its time budget."""


@dataclass(frozen=True)
class ComponentOutcome:
    """What one worker-side reward component made of one row.

    value None means the component could not be computed (``error`` says why) or, for a plugin, does not apply
    (``error`` None). ``note`` is a reason worth keeping alongside a value (a timeout counted as wrong, a failed test).
    """
    value: float | None
    note: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to score rows; sent once at start (picklable)."""
    reward_type: str
    timeout_s: float
    compute_accuracy: bool
    plugins: dict[str, str] = field(default_factory=dict)   # component name -> "module:function" spec
    answer_key: str = "gt_answer"
    sandbox_limits: dict[str, Any] | None = None
    concurrent_sandboxes: int = 1  # the pool's workers: each may run a jail at once (the memory caps add up)


class _RowScorer:
    """Scores rows for one WorkerSpec; lives in the worker process."""

    def __init__(self, spec: WorkerSpec):
        from grpo_core.rewards import accuracy
        from grpo_core.rewards.plugins import load_plugin

        self.spec = spec
        self.plugins = {name: load_plugin(plugin_spec) for name, plugin_spec in spec.plugins.items()}
        self.accuracy_function = self._accuracy_function(accuracy)

    def _accuracy_function(self, accuracy: Any) -> Any:
        spec = self.spec
        if spec.reward_type == "boxed":
            return lambda completion, row: accuracy.boxed_accuracy(completion, row, spec.answer_key)
        if spec.reward_type == "think_answer_tags":
            return lambda completion, row: accuracy.tag_accuracy(completion, row, spec.answer_key)
        if spec.reward_type == "code":
            from grpo_core.infra.sandbox import Sandbox, SandboxLimits

            # One checked sandbox per worker: SandboxUnavailable surfaces at start, not on the first row.
            sandbox = Sandbox(SandboxLimits(**(spec.sandbox_limits or {})), concurrent_runs=spec.concurrent_sandboxes)
            return lambda completion, row: accuracy.code_accuracy(completion, row, sandbox)
        raise ValueError(f"unknown reward type {spec.reward_type!r}; choose one of {accuracy.REWARD_TYPES}")

    def warm_up(self) -> None:
        """Pay math-verify's first-call cost (imports, grammar) before the first real row."""
        if self.spec.compute_accuracy and self.spec.reward_type != "code":
            from grpo_core.rewards.math_equiv import answers_match

            answers_match("1", "1")

    def score(self, completion: str, row: dict[str, Any]) -> dict[str, ComponentOutcome]:
        from grpo_core.rewards.accuracy import RowError

        outcomes: dict[str, ComponentOutcome] = {}
        if self.spec.compute_accuracy:
            try:
                verdict = self._with_alarm(self.accuracy_function, completion, row)
                outcomes[ACCURACY] = ComponentOutcome(verdict.value, verdict.note)
            except ComponentTimeout:
                outcomes[ACCURACY] = ComponentOutcome(
                    0.0, f"accuracy: verification exceeded {self.spec.timeout_s:g}s; counted as wrong")
            except RowError as error:
                outcomes[ACCURACY] = ComponentOutcome(None, error=f"accuracy: {error}")
        for name, function in self.plugins.items():
            outcomes[name] = self._plugin_outcome(name, function, completion, row)
        return outcomes

    def _plugin_outcome(self, name: str, function: Any, completion: str, row: dict[str, Any]) -> ComponentOutcome:
        from grpo_core.rewards.plugins import call_plugin

        columns = {key: [value] for key, value in row.items()}
        try:
            values = self._with_alarm(call_plugin, name, function, [completion], columns)
        except ComponentTimeout:
            return ComponentOutcome(None, error=f"plugin {name!r} exceeded {self.spec.timeout_s:g}s")
        except Exception as error:  # a user plugin may raise anything: the row keeps its place with the reason
            return ComponentOutcome(None, error=f"plugin {name!r} failed: {type(error).__name__}: {error}")
        return ComponentOutcome(values[0])

    def _with_alarm(self, function: Any, *args: Any) -> Any:
        signal.setitimer(signal.ITIMER_REAL, self.spec.timeout_s)
        try:
            return function(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _raise_timeout(signum: int, frame: Any) -> None:
    raise ComponentTimeout()


def worker_main(connection: Any, spec: WorkerSpec) -> None:
    """Entry point of a worker process: set up, say ready, then score rows until told to stop or the pipe closes."""
    os.setsid()  # own process group: the parent can kill the worker together with any sandbox it started
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us through the pipe
    signal.signal(signal.SIGALRM, _raise_timeout)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disabled its timeouts: we did
    try:
        scorer = _RowScorer(spec)
        scorer.warm_up()
    except Exception as error:  # reported to the parent, which raises it with this context
        fatal = type(error).__name__ if isinstance(error, _fatal_error_types(spec.reward_type)) else None
        connection.send(("init_failed", f"{type(error).__name__}: {error}\n{traceback.format_exc()}", fatal, str(error)))
        return
    connection.send(("ready",))
    _serve(connection, scorer)


def _fatal_error_types(reward_type: str) -> tuple[type[BaseException], ...]:
    """Errors that stop the whole scoring call instead of one row: no sandbox means no code can be judged."""
    if reward_type != "code":
        return ()
    from grpo_core.infra.sandbox import SandboxUnavailable

    return (SandboxUnavailable,)


def _serve(connection: Any, scorer: _RowScorer) -> None:
    fatal_types = _fatal_error_types(scorer.spec.reward_type)
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        for item_id, completion, row in message[1]:
            try:
                outcomes = scorer.score(completion, row)
            except fatal_types as error:
                connection.send(("fatal", item_id, type(error).__name__, str(error)))
                continue
            except Exception as error:  # an unexpected failure on one row: that row is unscorable, the worker lives
                outcomes = {ACCURACY: ComponentOutcome(
                    None, error=f"scoring failed: {type(error).__name__}: {error}")}
            except ComponentTimeout:  # an alarm that fired between components: treat as the accuracy timeout
                outcomes = {ACCURACY: ComponentOutcome(
                    0.0, f"accuracy: verification exceeded {scorer.spec.timeout_s:g}s; counted as wrong")}
            connection.send(("row", item_id, outcomes))
