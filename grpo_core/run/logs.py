"""The libraries' output of a run kept in its run folder (``logs/``), off the terminal unless asked for.

Why: vLLM, DeepSpeed, Ray and transformers write hundreds of lines (engine configs, kernel choices, deprecation
warnings) that bury the one line per iteration a person watches. They are worth keeping for debugging, with the run.
The engine actors run vLLM and DeepSpeed, so their whole process output (C++ included) goes to
``logs/<actor>.log`` of a run folder on a local disk; on a remote run store it stays in Ray's session logs
(``/tmp/ray/session_latest/logs``), and with ``logging.verbose`` it goes to the terminal as Ray forwards it.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

LOGS = "logs"
# Loggers of the libraries a driver process imports; their records go to logs/libraries.log unless verbose.
LIBRARY_LOGGERS = ("py.warnings", "ray", "transformers", "datasets", "torch", "deepspeed", "vllm", "filelock",
                   "fsspec", "s3fs", "urllib3", "httpx", "asyncio", "mlflow", "alembic")


def redirect_process_output(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C and C++ output too) to ``path``,
    appended (a restarted actor adds to its file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


@contextmanager
def process_output_to(path: str) -> Iterator[None]:
    """`redirect_process_output` for a while: for an engine the driver itself runs briefly (the eval gate's vLLM),
    whose C++ warnings and progress bars would otherwise reach the terminal. Restores both descriptors after."""
    saved = (os.dup(1), os.dup(2))
    try:
        redirect_process_output(path)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), saved):
            os.dup2(fd, target)
            os.close(fd)
