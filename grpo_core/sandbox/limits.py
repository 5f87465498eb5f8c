"""Resource limits for one sandboxed run.

Every limit is a plain field so that a config file can set it; the defaults suit one competitive-programming test
case (a few seconds, about 1 GiB, a few dozen processes, a few MiB of output). Values are validated up front so a bad
config fails when the sandbox is built, not halfway through scoring a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits applied to every run (one program, one stdin).

    cpu_time_s: RLIMIT_CPU of each process, rounded up to whole seconds (the kernel's granularity); the program is
        killed (SIGKILL) when it spends it.
    wall_time_s: wall-clock limit measured by the host side; the whole jail is killed when it passes.
    memory_mb: RLIMIT_AS (address space) of each process, in MiB.
    max_processes: RLIMIT_NPROC inside the jail's own user namespace (threads count too).
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

    Memory is limited per process (RLIMIT_AS; no cgroup is used, so nothing host-global is created): the worst
    case for one run is ``max_processes * memory_mb`` plus ``tmpfs_bytes``.
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
    def cpu_time_whole_s(self) -> int:
        """RLIMIT_CPU takes whole seconds: round up so the limit is never tighter than asked."""
        return max(1, math.ceil(self.cpu_time_s))

    @property
    def file_size_mb(self) -> int:
        """nsjail takes RLIMIT_FSIZE in MiB: round up."""
        return max(1, math.ceil(self.max_file_bytes / MIB))
