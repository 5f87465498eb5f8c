"""What the sandbox leaves on the host: processes of the jail's uid (65534) still alive after a run returned."""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from typing import Iterator

JAIL_UID = 65534
# Test modules that run the sandbox hold this lock (tests/conftest.py): shared by those that only use it, exclusive
# by those that count leftovers, so that no other jail of the suite (another pytest-xdist worker, another pytest
# run on the machine) runs while they count.
JAIL_LOCK = "/tmp/grpo-tests-jail.lock"


@contextmanager
def jail_lock(exclusive: bool) -> Iterator[None]:
    with open(JAIL_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def jailed_processes(timeout_s: float = 15.0) -> list[int]:
    """Host pids owned by the jail's uid; polls because the kernel reaps a dead PID namespace asynchronously (seconds
    on a loaded machine; returns as soon as none is left). A module that calls it holds JAIL_LOCK exclusively, so no
    other jail of the suite is running meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == JAIL_UID:
                        pids.append(int(entry))
                except FileNotFoundError:
                    continue
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def fork_bomb(tries: int, hold_s: int = 0) -> str:
    """A program that forks up to ``tries`` children (each sleeps 60 s), counting the forks that succeeded, prints
    ``forked N``, then holds its children ``hold_s`` seconds."""
    return ("import os, time\n"
            "n = 0\n"
            f"for _ in range({tries}):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        continue\n"
            "    if pid == 0:\n"
            "        time.sleep(60)\n"
            "        os._exit(0)\n"
            "    n += 1\n"
            "print('forked', n, flush=True)\n"
            + (f"time.sleep({hold_s})\n" if hold_s else ""))
