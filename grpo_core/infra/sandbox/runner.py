"""Run one untrusted Python program in a fresh nsjail, with hard limits, and report what happened.

One jail per run: nothing (files, processes, memory) survives from one run to the next, so submissions and test
cases cannot see each other. The host side reads stdout/stderr with a byte cap and a wall-clock deadline and kills
the jail when either is passed, so a hostile program can neither blow up the scorer's memory nor hold it past the
limit. The run's memory and process count are capped for its whole process tree by a cgroup of its own where the host
allows one (:mod:`grpo_core.infra.sandbox.cgroups`), which is removed after the run. A :class:`Sandbox` holds only immutable
configuration, so one instance may be shared by threads.
"""

from __future__ import annotations

import logging
import os
import sys
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from grpo_core.infra.sandbox.cgroups import (
    TreeCaps,
    TreeUsage,
    detect_tree_caps,
    run_cgroups,
    sweep_stale_run_cgroups,
)
from grpo_core.infra.sandbox.limits import SandboxLimits, memory_budget
from grpo_core.infra.sandbox.nsjail import (
    InterpreterLayout,
    SandboxUnavailable,
    build_command,
    error_lines,
    locate_nsjail,
    read_verdict,
)

_READ_CHUNK = 64 * 1024
_KILL_GRACE_S = 2.0
_DEFAULT_PYTHONS = ("/usr/bin/python3",)
# The kernel charges memory to a cgroup in batches of pages: when the OOM killer fires, the peak it recorded may sit
# this far below the cap.
_CAP_SLACK_BYTES = 2**20

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """Outcome of one run.

    exit_code: the program's exit status, None when it was killed by a signal (or never started).
    signal: the signal that killed it (9 for the CPU limit, the wall limit, the output cap), else None.
    timed_out: the wall-clock limit was reached (CPU-limit kills show up as ``signal`` 9 or 24 with this False).
    output_truncated: stdout or stderr passed ``max_output_bytes``; the program was killed and the output cut.
    memory_exceeded: the run failed and either died with a Python ``MemoryError`` (RLIMIT_AS makes one allocation
        fail rather than killing the process) or its tree reached the memory cap (the cgroup's OOM killer ended
        some of its processes).
    wall_s: wall-clock seconds of the whole run, jail set-up included.
    peak_memory_bytes / peak_processes: the whole tree's peak memory and process count as its cgroup measured them;
        None where no cgroup caps the run (or the kernel has no such counter).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    output_truncated: bool
    memory_exceeded: bool
    wall_s: float
    peak_memory_bytes: int | None = None
    peak_processes: int | None = None

    @property
    def ok(self) -> bool:
        """The program ran to completion with exit status 0 inside every limit."""
        return self.exit_code == 0 and not (self.timed_out or self.output_truncated or self.signal)


def default_python() -> str:
    """The system Python if present (smallest, distro-managed tree), else this process's base interpreter."""
    for candidate in _DEFAULT_PYTHONS:
        if os.access(candidate, os.X_OK):
            return candidate
    return getattr(sys, "_base_executable", None) or sys.executable


class Sandbox:
    """Runs Python programs in nsjail under ``limits``; construction checks that a jail actually starts.

    Raises :class:`SandboxUnavailable` (with the reason) when nsjail is missing or cannot create namespaces here:
    callers must then refuse to score code rather than run it unsandboxed.

    concurrent_runs: how many runs go on at once on this machine under these limits (one per reward worker:
    ``reward.num_workers``). Where a cgroup caps each run, ``concurrent_runs * memory_mb`` above half the machine's
    memory is a ValueError; where none can (per-process rlimits only), that is logged as a warning instead, with the
    reason no cgroup could be used.
    tree_caps: how runs are capped as a whole; None (the default) detects it (:func:`detect_tree_caps`).
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        python: str | None = None,
        *,
        nsjail: str | None = None,
        scratch_dir: str | None = None,
        concurrent_runs: int = 1,
        tree_caps: TreeCaps | None = None,
    ) -> None:
        self.limits = limits
        self.nsjail = locate_nsjail(nsjail)
        self.layout = InterpreterLayout.probe(python or default_python())
        self.scratch_dir = scratch_dir
        self.tree_caps = detect_tree_caps() if tree_caps is None else tree_caps
        self._check_memory_budget(concurrent_runs)
        if self.tree_caps.capped:
            sweep_stale_run_cgroups(self.tree_caps)
        self._self_check()

    def _check_memory_budget(self, concurrent_runs: int) -> None:
        caps: TreeCaps = self.tree_caps
        budget = memory_budget(self.limits, concurrent_runs, tree_capped=caps.capped)
        if caps.capped:
            logger.info("sandbox: each run capped as a whole (%s): %d MiB, %d processes",
                        caps.reason, self.limits.memory_mb, self.limits.max_processes)
            if not budget.fits:
                raise ValueError(f"sandbox memory: {budget.describe()}; lower the sandbox's memory_mb "
                                 "(reward.options.sandbox) or reward.num_workers")
            return
        logger.warning("sandbox: no cgroup can cap a run's process tree here (%s); memory and processes are limited "
                       "per process only (rlimits): one run may hold up to %d processes x %d MiB + %d MiB tmpfs%s",
                       caps.reason, self.limits.max_processes, self.limits.memory_mb,
                       self.limits.tmpfs_bytes // 2**20,
                       "" if budget.fits else f"; that exceeds the memory budget: {budget.describe()}")

    def _self_check(self) -> None:
        probe = self.run("import sys\nprint(sys.stdin.read().upper(), end='')\n", stdin="jail ok")
        if probe.stdout != "JAIL OK" or probe.exit_code != 0:
            raise SandboxUnavailable(
                f"nsjail at {self.nsjail} could not run {self.layout.executable}: exit={probe.exit_code} "
                f"signal={probe.signal} stdout={probe.stdout[:200]!r} stderr={probe.stderr[-2000:]!r}"
            )

    def run(self, program: str, stdin: str = "") -> RunResult:
        """Run ``program`` (Python source) with ``stdin``; always returns within about ``wall_time_s`` + 2 s."""
        with tempfile.TemporaryDirectory(prefix="grpo-sandbox-", dir=self.scratch_dir) as scratch:
            os.chmod(scratch, 0o711)  # the jail's setup runs as the mapped uid: it must traverse, not list
            program_file = os.path.join(scratch, "main.py")
            stdin_file = os.path.join(scratch, "stdin")
            log_file = os.path.join(scratch, "nsjail.log")
            _write_readonly(program_file, program)
            _write_readonly(stdin_file, stdin)
            start = time.monotonic()
            with run_cgroups(self.tree_caps) as cgroups, open(stdin_file, "rb") as stdin_fh:
                tree_args = None if cgroups is None else cgroups.nsjail_args(self.limits.memory_bytes,
                                                                             self.limits.max_processes)
                argv = build_command(self.nsjail, self.layout, self.limits, program_file, log_file, tree_args)
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=stdin_fh,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        env={},
                        close_fds=True,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise SandboxUnavailable(f"cannot start nsjail {self.nsjail}: {exc}") from exc
                capture = _capture(proc, self.limits, start + self.limits.wall_time_s)
                wall = time.monotonic() - start
                usage = TreeUsage(None, None) if cgroups is None else cgroups.usage()
            log_text = _read_text(log_file)
        verdict = read_verdict(log_text)
        if not verdict.started:
            raise SandboxUnavailable(
                f"nsjail did not start the program (exit {proc.returncode}):\n{error_lines(log_text)}"
            )
        stderr = capture.stderr.decode("utf-8", errors="replace")
        sig = verdict.signal
        if sig is None and (capture.killed or verdict.exit_code is None):
            sig = signal.SIGKILL.value
        exit_code = None if sig is not None else verdict.exit_code
        return RunResult(
            stdout=capture.stdout.decode("utf-8", errors="replace"),
            stderr=stderr,
            exit_code=exit_code,
            signal=sig,
            timed_out=capture.timed_out or verdict.time_limit_hit,
            output_truncated=capture.truncated,
            memory_exceeded=_memory_exceeded(exit_code, sig, stderr, usage, self.limits),
            wall_s=wall,
            peak_memory_bytes=usage.peak_memory_bytes,
            peak_processes=usage.peak_processes,
        )


@dataclass
class _Capture:
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    killed: bool


def _capture(proc: subprocess.Popen, limits: SandboxLimits, deadline: float) -> _Capture:
    """Read both pipes until EOF, the deadline, or the byte cap; kill the jail in the last two cases."""
    assert proc.stdout is not None and proc.stderr is not None
    cap = limits.max_output_bytes
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = timed_out = False
    with selectors.DefaultSelector() as sel:
        for fh in (proc.stdout, proc.stderr):
            os.set_blocking(fh.fileno(), False)
            sel.register(fh.fileno(), selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=remaining):
                fd = key.fd
                buf = buffers[fd]
                try:
                    chunk = os.read(fd, min(_READ_CHUNK, cap + 1 - len(buf)))
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf += chunk
                if len(buf) > cap:
                    del buf[cap:]
                    truncated = True
            if truncated:
                break
    killed = False
    if truncated or timed_out:
        killed = _kill_jail(proc)
    else:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) + _KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            killed = _kill_jail(proc)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    stdout, stderr = bytes(buffers[out_fd]), bytes(buffers[err_fd])
    proc.stdout.close()
    proc.stderr.close()
    return _Capture(stdout=stdout, stderr=stderr, truncated=truncated, timed_out=timed_out, killed=killed)


def _kill_jail(proc: subprocess.Popen) -> bool:
    """SIGKILL nsjail; its child is PID 1 of the jail's PID namespace and dies with it (PDEATHSIG), taking every
    process in the namespace along."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"nsjail pid {proc.pid} did not exit after SIGKILL") from exc
    return True


def _write_readonly(path: str, text: str) -> None:
    """Write a file the jail's uid can read (0644) but not modify (owned by us)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _memory_exceeded(exit_code: int | None, sig: int | None, stderr: str, usage: TreeUsage,
                     limits: SandboxLimits) -> bool:
    """The run failed for lack of memory: a ``MemoryError`` (RLIMIT_AS), or its tree reached the cgroup's cap."""
    if exit_code not in (None, 0) and _died_of_memory_error(stderr):
        return True
    failed = sig is not None or exit_code != 0
    peak = usage.peak_memory_bytes
    return failed and peak is not None and peak >= limits.memory_bytes - _CAP_SLACK_BYTES


def _died_of_memory_error(stderr: str) -> bool:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith("MemoryError")
