"""One promotion at a time: an exclusive lock file held while a gate compares against the champion and records
its decision.

The lock is a POSIX file lock (``fcntl.flock``) on this machine: beside a local registry, or, for a registry
elsewhere (an S3 folder, an MLflow server), in the temporary folder under a name derived from its location. Runs on
one host are serialised; runs on several hosts sharing a remote registry are not (see docs/guides/retraining.md).
The kernel drops the lock when the holder dies, so a killed run never leaves it held.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from grpo_core.lifecycle.registry.records import RegistryUnavailable, status_line


def lock_path(location: str, local_dir: str | None) -> str:
    if local_dir is not None:
        return os.path.join(local_dir, ".promotion.lock")
    digest = hashlib.sha256(location.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"grpo-registry-{digest}.lock")


@contextmanager
def exclusive(path: str, location: str, on_wait: Callable[[str], None] = status_line) -> Iterator[None]:
    """Hold the lock at ``path``; says once when another holder makes it wait (by default on stderr: a command's
    output stays its own)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+")
    except OSError as err:
        raise RegistryUnavailable(f"{location}: cannot open its promotion lock {path}: {err}") from err
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            started = time.monotonic()
            on_wait(f"another run is promoting into {location}: waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
            on_wait(f"registry lock taken after {time.monotonic() - started:.1f}s")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
