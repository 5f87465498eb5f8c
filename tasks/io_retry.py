"""Prefect retries for stages whose run-folder I/O failed transiently (object store down, timeouts).

Every task that reads or writes the run folder gets these options for the flow run (``with_options``), so a
storage outage shows in the UI as retried task runs, and an error that a retry cannot fix (a missing file, a bad
value, a dead engine) fails at once.
"""
from __future__ import annotations

from typing import Any

from grpo_core.config import StorageConfig
from grpo_core.run.storage import is_transient_io_error


def retry_on_transient_io(task, task_run, state) -> bool:
    """Prefect's retry_condition_fn: retry only when the failure was storage not answering."""
    exc = state.data
    return isinstance(exc, BaseException) and is_transient_io_error(exc)


def io_retry_options(storage: StorageConfig) -> dict[str, Any]:
    return {"retries": storage.retries, "retry_delay_seconds": storage.retry_delays or 0,
            "retry_condition_fn": retry_on_transient_io}
