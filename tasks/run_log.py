"""Where a run's log lines go: the flow's own lines to the Prefect UI's Logs tab, the terminal and the run folder;
the libraries' lines (vLLM, DeepSpeed, Ray, transformers, Python warnings) to the run folder only.

Why: a person watching `grpo train` wants the progress bar and one line per iteration, not hundreds of engine
lines; a person in the Prefect UI wants the same lines in the flow run's Logs tab; and whoever debugs a run later
wants everything, kept with the run. The flow's lines are what it prints (Prefect's ``log_prints`` turns them into
records of the run logger): they go to the Logs tab at INFO whatever ``PREFECT_LOGGING_LEVEL`` says (that setting
keeps Prefect's own client chatter quiet), to the terminal (Prefect's per-task engine lines only when they are
warnings), and to ``logs/flow.log``; Prefect's per-task "Finished in state Completed()" line goes nowhere (the
task runs' states say it). Library lines go to ``logs/libraries.log``; the engine actors' output (vLLM and DeepSpeed
run there) to ``logs/<actor>.log`` (``grpo_core.run.logs``). ``logging.verbose`` (``grpo train -v``) puts the libraries
back on the terminal. With a remote run store the files are written locally and uploaded at the end.
"""
from __future__ import annotations

import logging
import os
import tempfile
from contextlib import contextmanager
from typing import Iterator

import prefect
from rich.console import Console

from grpo_core.config import GRPOConfig
from grpo_core.run.logs import LIBRARY_LOGGERS, LOGS
from grpo_core.run.storage import RunStore

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_PREFECT_DIR = os.path.dirname(prefect.__file__)
_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


class _Terminal(logging.Handler):
    """The flow's own lines (prints, our code's records) and every warning, as plain text through the console
    that draws the progress bar (so they appear above it)."""

    def __init__(self, console: Console):
        super().__init__(logging.INFO)
        self.console = console

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.pathname.startswith(_PREFECT_DIR)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(record.getMessage(), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never break the run (logging.Handler's own rule)
            self.handleError(record)


def _not_task_completion(record: logging.LogRecord) -> bool:
    """False for Prefect's "Finished in state Completed()" line of every task run: five or more an iteration, each
    sent to the Logs tab, flow.log and the API (about 5 ms of the tiny task's 0.45 s iteration), and all saying what
    the task runs' states already show. Failures (ERROR) and retries (their own INFO line) still pass."""
    return record.levelno >= logging.WARNING or record.funcName != "log_finished_message"


@contextmanager
def flow_lines_at_info() -> Iterator[None]:
    """The flow's printed lines reach the Logs tab at INFO whatever ``PREFECT_LOGGING_LEVEL`` says, for a flow that
    trains nothing itself (``grpo-sft-rl``, whose stages are subflows with ``run_logging`` of their own)."""
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextmanager
def run_logging(cfg: GRPOConfig, store: RunStore, console: Console) -> Iterator[None]:
    """Route the log lines as the module docstring says, for the duration of the flow run; restore after."""
    folder = store.local_path(LOGS)
    staging = None
    if folder is None:
        staging = tempfile.mkdtemp(prefix="grpo-logs-")
        folder = staging
    os.makedirs(folder, exist_ok=True)
    saved = []

    def take(name: str, level: int, handlers: list[logging.Handler]) -> None:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate, list(logger.handlers)))
        logger.setLevel(level)
        logger.propagate = False
        for handler in handlers:
            logger.addHandler(handler)

    flow_file = logging.FileHandler(os.path.join(folder, "flow.log"))
    flow_file.setFormatter(_FORMAT)
    terminal = _Terminal(console)
    for name in RUN_LOGGERS:  # Prefect's API handler stays on them: that is the Logs tab
        take(name, logging.INFO, [terminal, flow_file])
    task_runs = logging.getLogger("prefect.task_runs")
    task_runs.addFilter(_not_task_completion)
    library_file = None
    if not cfg.logging.verbose:
        library_file = logging.FileHandler(os.path.join(folder, "libraries.log"))
        library_file.setFormatter(_FORMAT)
        logging.captureWarnings(True)
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            take(name, logger.level or logging.INFO, [])
            logger.handlers = [library_file]
    try:
        yield
    finally:
        task_runs.removeFilter(_not_task_completion)
        for logger, level, propagate, handlers in reversed(saved):
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers = handlers
        if library_file is not None:
            logging.captureWarnings(False)
            library_file.close()
        flow_file.close()
        if staging is not None:
            store.move_in(LOGS, staging)
