"""Long-lived helper processes a run starts (an S3 server, an Atropos API server, an outside environment): started
with their output in a log file, asked by Linux to die with the run (so a SIGKILLed run leaves none behind), stopped
with SIGTERM then SIGKILL, started again with the same arguments."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Runs in the child before exec: Linux sends it ``sig`` when the parent dies (a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


@dataclass
class ChildProcess:
    """One helper process; ``starts`` counts how often it was (re)started."""
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    cwd: str | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)
    starts: int = 0

    def start(self) -> "ChildProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"==> start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.argv, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                            preexec_fn=die_with_parent)
        self.starts += 1
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL; idempotent."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (another user's counts: signal 0 is refused, not unanswered)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
