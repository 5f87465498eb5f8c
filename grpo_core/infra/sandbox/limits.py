"""Resource limits for one sandboxed run.

Every limit is a plain field so that a config file can set it; the defaults suit one competitive-programming test
case (a few seconds, 1 GiB for the whole run, 32 processes, a few MiB of output). Values are validated up front so a
bad config fails when the sandbox is built, not halfway through scoring a batch; :func:`memory_budget` says whether
the runs that go on at once (one per reward worker) fit the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import psutil

MIB = 2**20
GIB = 2**30
# Sandboxed runs share the host with the trainer, the inference engine and the page cache: together they may take at
# most this share of the machine's memory.
MACHINE_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to every run (one program, one stdin).

    cpu_time_s: RLIMIT_CPU of each process, rounded up to whole seconds (the kernel's granularity); the program is
        killed (SIGKILL) when it spends it.
    wall_time_s: wall-clock limit measured by the host side; the whole jail is killed when it passes.
    memory_mb: memory cap of the whole run in MiB: every process of the jail together, its tmpfs included (a
        cgroup, see :mod:`grpo_core.infra.sandbox.cgroups`); also RLIMIT_AS (address space) of each process, so that one
        huge allocation fails with ``MemoryError`` instead of waking the OOM killer.
    max_processes: processes (threads count too) of the whole run (the cgroup's pids cap), and RLIMIT_NPROC inside
        the jail's own user namespace.
    max_output_bytes: cap on stdout and on stderr, each; a program that writes more is killed and its run is marked
        ``output_truncated`` (the host never buffers more than this).
    max_file_bytes: RLIMIT_FSIZE (largest file the program may write), rounded up to whole MiB.
    tmpfs_bytes: size of the private tmpfs mounted at the working directory (``/tmp``); tmpfs pages are not counted
        by RLIMIT_AS, so this bounds the memory a program can park in files.
    max_open_files: RLIMIT_NOFILE.
    stack_mb: RLIMIT_STACK in MiB (deep recursion in Python needs more than the usual 8 MiB).
    max_cpus: CPUs the jail may run on (sched affinity); 0 means no restriction.
    nice_level: scheduling niceness of the jail (19: yield to everything else on the host; lower it if wall-clock
        timeouts on a busy machine turn correct programs into failures).

    Where no cgroup can be used (the Sandbox logs it when built) only the rlimits apply, per process: the worst case
    for one run is then ``max_processes * memory_mb`` plus ``tmpfs_bytes`` (see :meth:`worst_case_bytes`).
    """

    cpu_time_s: float = 2.0
    wall_time_s: float = 5.0
    memory_mb: int = 1024
    max_processes: int = 32
    max_output_bytes: int = 4 * MIB
    max_file_bytes: int = 16 * MIB
    tmpfs_bytes: int = 32 * MIB
    max_open_files: int = 64
    stack_mb: int = 64
    max_cpus: int = 1
    nice_level: int = 19

    def __post_init__(self) -> None:
        positive = {
            "cpu_time_s": self.cpu_time_s,
            "wall_time_s": self.wall_time_s,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "max_output_bytes": self.max_output_bytes,
            "max_file_bytes": self.max_file_bytes,
            "tmpfs_bytes": self.tmpfs_bytes,
            "max_open_files": self.max_open_files,
            "stack_mb": self.stack_mb,
        }
        for name, value in positive.items():
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"SandboxLimits.{name} must be a positive finite number, got {value!r}")
        if self.max_cpus < 0:
            raise ValueError(f"SandboxLimits.max_cpus must be >= 0, got {self.max_cpus!r}")
        if not -20 <= self.nice_level <= 19:
            raise ValueError(f"SandboxLimits.nice_level must be in [-20, 19], got {self.nice_level!r}")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb={self.memory_mb} is too small to start Python (need >= 64)")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * MIB

    def worst_case_bytes(self, tree_capped: bool) -> int:
        """Most memory one run can hold: the cap of its tree, or with per-process rlimits only, every process at its
        RLIMIT_AS plus a full tmpfs (tmpfs pages are charged to the cgroup, not to RLIMIT_AS)."""
        if tree_capped:
            return self.memory_bytes
        return self.max_processes * self.memory_bytes + self.tmpfs_bytes

    @property
    def cpu_time_whole_s(self) -> int:
        """RLIMIT_CPU takes whole seconds: round up so the limit is never tighter than asked."""
        return max(1, math.ceil(self.cpu_time_s))

    @property
    def file_size_mb(self) -> int:
        """nsjail takes RLIMIT_FSIZE in MiB: round up."""
        return max(1, math.ceil(self.max_file_bytes / MIB))


@dataclass(frozen=True)
class MemoryBudget:
    """The memory that ``concurrent_runs`` sandboxed runs can hold together, against the machine's."""

    per_run_bytes: int
    concurrent_runs: int
    machine_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.per_run_bytes * self.concurrent_runs

    @property
    def allowed_bytes(self) -> int:
        return int(self.machine_bytes * MACHINE_MEMORY_SHARE)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.allowed_bytes

    def describe(self) -> str:
        return (f"{self.concurrent_runs} concurrent run(s) x {self.per_run_bytes / GIB:.2f} GiB = "
                f"{self.total_bytes / GIB:.2f} GiB, against {MACHINE_MEMORY_SHARE:.0%} of this machine's "
                f"{self.machine_bytes / GIB:.1f} GiB ({self.allowed_bytes / GIB:.1f} GiB)")


def machine_memory_bytes() -> int:
    """Physical memory of this machine (MemTotal; swap aside)."""
    return int(psutil.virtual_memory().total)


def memory_budget(limits: SandboxLimits, concurrent_runs: int, tree_capped: bool,
                  machine_bytes: int | None = None) -> MemoryBudget:
    """How much ``concurrent_runs`` runs under ``limits`` can hold together (one per reward worker:
    ``reward.num_workers``), next to the machine's memory."""
    if concurrent_runs < 1:
        raise ValueError(f"concurrent_runs must be >= 1, got {concurrent_runs!r}")
    return MemoryBudget(per_run_bytes=limits.worst_case_bytes(tree_capped), concurrent_runs=concurrent_runs,
                        machine_bytes=machine_memory_bytes() if machine_bytes is None else machine_bytes)
