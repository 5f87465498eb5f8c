"""A local file only its owner may read (a bearer token, S3 credentials), readable by no one else at any moment: it
is created with mode 0600 (``os.open``: the umask can only take bits away) under a temporary name and renamed into
place, so neither the temporary file nor the final one is ever more open than that. Writing the file, then
``chmod``-ing it, leaves a moment in which another local user can read it."""
from __future__ import annotations

import os
import uuid

OWNER_ONLY = 0o600


def write_private(path: str | os.PathLike, data: bytes) -> None:
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
