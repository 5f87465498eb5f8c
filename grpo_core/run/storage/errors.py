"""The errors of the run folder, and which I/O errors are worth retrying.

Why a module of their own: callers (the resume logic, the CLI, the Prefect tasks' retry rule) catch these without
caring which part of the store raised them, and the retry rule must not pull in the object-store clients.
"""

from __future__ import annotations

import errno


class StageIncomplete(FileNotFoundError):
    """A stage output is not complete: unlisted in its manifest, missing, or not what was recorded."""


class ConfigConflict(ValueError):
    """``write_config`` was given a config that differs from the one the run was started with."""


class MetricsSchemaError(TypeError):
    """A metrics row does not fit the types already stored in metrics.parquet."""


class StorageError(OSError):
    """A run-folder file exists but cannot be understood (e.g. a manifest that is not JSON)."""


_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EAGAIN}
# Exception classes of the object-store client stack (botocore, aiohttp, fsspec) that mean "the service did not
# answer", matched by module and name so that this module does not import them.
_TRANSIENT_CLASSES = {("botocore.exceptions", "ConnectionError"), ("botocore.exceptions", "HTTPClientError"),
                      ("aiohttp.client_exceptions", "ClientConnectionError"),
                      ("aiohttp.client_exceptions", "ServerTimeoutError"), ("fsspec.exceptions", "FSTimeoutError")}


def is_transient_io_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything in its cause chain, including the cause an actor raised) is the storage service
    not answering (connection refused or reset, timeout): worth retrying, unlike a missing file or a bad value."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if any((c.__module__, c.__name__) in _TRANSIENT_CLASSES for c in type(e).__mro__):
            return True
        todo.extend([e.__cause__, e.__context__, getattr(e, "cause", None)])
    return False
