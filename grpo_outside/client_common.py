"""What every driver the run starts as an endpoint client does alike (imported by the drivers beside it, in whichever
virtual environment they run; nothing of the project, nothing outside the standard library)."""
from __future__ import annotations

import time
import uuid


def group_prefix(kind: str) -> str:
    """Group names unique to this start: a restarted driver never adds to a group an earlier one left short."""
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def wait_to_be_stopped(played: int) -> None:
    """A client that exits is started again by the run: one with nothing left to play waits instead."""
    print(f"played {played} tasks; waiting to be stopped", flush=True)
    while True:
        time.sleep(3600)
