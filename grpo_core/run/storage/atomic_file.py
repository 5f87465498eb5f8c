"""Writing a local file whole or not at all, with the mode it must have from its first byte.

The data goes to a temporary name in the same folder (created by ``os.open`` with ``mode``: the umask can only take
bits away), is synced, then renamed into place: a reader sees the old file or the whole new one, never part of it. A
file only its owner may read (a bearer token, S3 credentials) is written with 0600 this way: writing it, then
``chmod``-ing it, leaves a moment in which another local user can read it.
"""
from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from typing import Iterator

OWNER_ONLY = 0o600
USUAL = 0o666  # the usual permissions, less the umask


@contextmanager
def replaced_atomically(path: str | os.PathLike) -> Iterator[str]:
    """A temporary name beside ``path`` for the caller to write; renamed over ``path`` when the block ends, removed
    if it raises."""
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_atomically(path: str | os.PathLike, data: bytes, mode: int = USUAL) -> None:
    with replaced_atomically(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def write_private(path: str | os.PathLike, data: bytes) -> None:
    """``path`` readable by its owner only, at every moment."""
    write_atomically(path, data, OWNER_ONLY)
