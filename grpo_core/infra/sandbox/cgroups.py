"""Capping one sandboxed run as a whole (every process the program forks) with cgroups, through nsjail's options.

Rlimits act per process: with RLIMIT_AS=1 GiB and RLIMIT_NPROC=32, 32 processes may hold 32 GiB together. A cgroup
counts the whole tree instead (anonymous memory, page cache and the jail's tmpfs pages alike), so the run's memory
cap and process count hold however the program forks.

Mechanisms, the first that works on this host is used (:func:`detect_tree_caps`):

- ``cgroup2``: the unified hierarchy, when this process's cgroup already delegates the ``memory`` and ``pids``
  controllers to its children (its ``cgroup.subtree_control`` lists them). A cgroup that holds processes can do that
  only at the root of the hierarchy (a VM, a host, a container run as root with ``--cgroupns=host``); elsewhere the
  "no internal processes" rule forbids it and the next mechanism is tried;
- ``cgroup1``: the v1 ``memory`` and ``pids`` hierarchies, children created inside this process's own cgroups;
- ``none``: no cgroup can be created here; the per-process rlimits are all there is, and the Sandbox says so in the
  log when it is built.

Per run (:func:`run_cgroups`): a fresh parent cgroup ``grpo-sandbox-<pid namespace>-<pid>-<random>`` inside this
process's own cgroup. nsjail (``--cgroup_mem_max``/``--cgroup_pids_max``) creates ``NSJAIL.<pid>`` under it with the
limits and removes it when the jail ends; the parent holds nothing else, so its hierarchical peak usage is the run's
peak. The parent is removed after the run (any process still in it is killed first). Parents left behind by a
process that died mid-run (a reward worker killed on its hard timeout) are removed by the next
:func:`sweep_stale_run_cgroups`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from grpo_core.infra.child_process import process_exists
from grpo_core.infra.sandbox.nsjail import SandboxUnavailable

logger = logging.getLogger(__name__)

RUN_PREFIX = "grpo-sandbox-"
_RUN_NAME = re.compile(rf"^{re.escape(RUN_PREFIX)}(\d+)-(\d+)-[0-9a-f]+$")
_REMOVE_TIMEOUT_S = 5.0
_REMOVE_POLL_S = 0.02

Kind = Literal["cgroup2", "cgroup1", "none"]


class RunCgroupError(SandboxUnavailable):
    """A run's cgroup could not be created although the host offered cgroups when the Sandbox was built: the run is
    refused rather than run without the cap."""


@dataclass(frozen=True)
class TreeCaps:
    """Which mechanism caps a run's process tree here, and where its per-run cgroups go.

    memory_base / pids_base: this process's own cgroup directories (the same directory for cgroup2) in which the
        per-run parents are created; None for ``none``.
    memory_mount / pids_mount: the hierarchies' mount points (cgroup1: nsjail takes the mount and a path below it).
    reason: for ``none``, why no cgroup mechanism could be used; otherwise what was found.
    """

    kind: Kind
    reason: str
    memory_base: str | None = None
    pids_base: str | None = None
    memory_mount: str | None = None
    pids_mount: str | None = None

    @property
    def capped(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class TreeUsage:
    """What a capped run's cgroups measured (None where the kernel exposes no such counter)."""

    peak_memory_bytes: int | None
    peak_processes: int | None


@dataclass(frozen=True)
class _Mount:
    root: str  # the hierarchy's path mounted there (mountinfo field 4)
    point: str


def _mounts(mountinfo_text: str) -> tuple[dict[str, _Mount], _Mount | None]:
    """cgroup v1 mounts by controller name, and the cgroup2 mount (first of each)."""
    v1: dict[str, _Mount] = {}
    v2: _Mount | None = None
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 4:
            continue
        mount = _Mount(root=_unescape(fields[3]), point=_unescape(fields[4]))
        fstype, super_options = fields[sep + 1], fields[sep + 3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount
        elif fstype == "cgroup":
            for option in super_options:
                v1.setdefault(option, mount)
    return v1, v2


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _own_paths(cgroup_text: str) -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its cgroup2 path (the ``0::`` line)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        else:
            for controller in controllers.split(","):
                v1[controller] = path
    return v1, v2


def _own_dir(mount: _Mount, own_path: str) -> str | None:
    """Where this process's cgroup is in the mounted tree; None when the mount does not contain it."""
    root = mount.root.rstrip("/")
    if root and own_path != root and not own_path.startswith(root + "/"):
        return None
    relative = own_path[len(root):].lstrip("/")
    return os.path.join(mount.point, relative) if relative else mount.point


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _pid_namespace() -> int:
    """Identifies this process's PID namespace: a pid in a run cgroup's name means something only within it."""
    return os.stat("/proc/self/ns/pid").st_ino


def run_cgroup_name() -> str:
    """A fresh per-run cgroup name that says which process (in which PID namespace) made it."""
    return f"{RUN_PREFIX}{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(6)}"


def _probe_mkdir(base: str) -> str | None:
    """None when a child cgroup can be created (and removed) in ``base``, else why not."""
    probe = os.path.join(base, run_cgroup_name())
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a cgroup in {base}: {exc.strerror}"
    try:
        os.rmdir(probe)
    except OSError as exc:
        return f"cannot remove the probe cgroup {probe}: {exc.strerror}"
    return None


def _detect_v2(mount: _Mount | None, own_path: str | None) -> TreeCaps | str:
    if mount is None or own_path is None:
        return "no cgroup2 mount"
    base = _own_dir(mount, own_path)
    if base is None:
        return f"cgroup2 at {mount.point} does not contain this process's cgroup {own_path}"
    try:
        available = _read(os.path.join(base, "cgroup.controllers")).split()
        delegated = _read(os.path.join(base, "cgroup.subtree_control")).split()
    except OSError as exc:
        return f"cgroup2 at {base}: {exc}"
    missing = [c for c in ("memory", "pids") if c not in available or c not in delegated]
    if missing:
        return (f"cgroup2 at {base} does not delegate {','.join(missing)} to child cgroups "
                f"(cgroup.controllers: {' '.join(available) or '-'}; cgroup.subtree_control: "
                f"{' '.join(delegated) or '-'})")
    refused = _probe_mkdir(base)
    if refused:
        return f"cgroup2: {refused}"
    return TreeCaps(kind="cgroup2", reason=f"cgroup2 memory+pids under {base}", memory_base=base, pids_base=base,
                    memory_mount=mount.point, pids_mount=mount.point)


def _detect_v1(mounts: dict[str, _Mount], own: dict[str, str]) -> TreeCaps | str:
    bases: dict[str, str] = {}
    for controller in ("memory", "pids"):
        mount = mounts.get(controller)
        if mount is None or controller not in own:
            return f"no cgroup v1 {controller} hierarchy"
        base = _own_dir(mount, own[controller])
        if base is None:
            return f"cgroup v1 {controller} at {mount.point} does not contain this process's cgroup {own[controller]}"
        refused = _probe_mkdir(base)
        if refused:
            return f"cgroup v1 {controller}: {refused}"
        bases[controller] = base
    return TreeCaps(kind="cgroup1", reason=f"cgroup v1 memory under {bases['memory']}, pids under {bases['pids']}",
                    memory_base=bases["memory"], pids_base=bases["pids"],
                    memory_mount=mounts["memory"].point, pids_mount=mounts["pids"].point)


def detect_tree_caps(proc_self: str = "/proc/self") -> TreeCaps:
    """Pick the mechanism (see the module docstring); reads ``<proc_self>/mountinfo`` and ``<proc_self>/cgroup`` and
    test-creates one child cgroup where it would put the per-run ones."""
    try:
        mountinfo = _read(os.path.join(proc_self, "mountinfo"))
        cgroup = _read(os.path.join(proc_self, "cgroup"))
    except OSError as exc:
        return TreeCaps(kind="none", reason=f"cannot read this process's cgroups: {exc}")
    v1_mounts, v2_mount = _mounts(mountinfo)
    v1_own, v2_own = _own_paths(cgroup)
    v2 = _detect_v2(v2_mount, v2_own)
    if isinstance(v2, TreeCaps):
        return v2
    v1 = _detect_v1(v1_mounts, v1_own)
    if isinstance(v1, TreeCaps):
        return v1
    return TreeCaps(kind="none", reason=f"{v2}; {v1}")


@dataclass(frozen=True)
class RunCgroups:
    """The parent cgroups of one run (both the same directory for cgroup2)."""

    caps: TreeCaps
    memory_dir: str
    pids_dir: str

    def nsjail_args(self, memory_bytes: int, max_processes: int) -> list[str]:
        """nsjail's options that put the jail in ``NSJAIL.<pid>`` below this run's parents, with the caps set.

        Swap is capped at 0 beyond the memory cap where the kernel accounts it (otherwise a host with swap would let
        the tree grow past the cap into swap)."""
        args = ["--cgroup_mem_max", str(memory_bytes), "--cgroup_pids_max", str(max_processes)]
        if self.caps.kind == "cgroup2":
            args += ["--use_cgroupv2", "--cgroupv2_mount", self.memory_dir]
            swap_file = "memory.swap.max"
        else:
            assert self.caps.memory_mount is not None and self.caps.pids_mount is not None
            args += [
                "--cgroup_mem_mount", self.caps.memory_mount,
                "--cgroup_mem_parent", os.path.relpath(self.memory_dir, self.caps.memory_mount),
                "--cgroup_pids_mount", self.caps.pids_mount,
                "--cgroup_pids_parent", os.path.relpath(self.pids_dir, self.caps.pids_mount),
            ]
            swap_file = "memory.memsw.limit_in_bytes"
        if os.path.exists(os.path.join(self.memory_dir, swap_file)):
            args += ["--cgroup_mem_swap_max", "0"]
        return args

    def usage(self) -> TreeUsage:
        """Peak memory and process count of the run's whole tree (the parents hold nothing but the jail)."""
        memory_file = "memory.peak" if self.caps.kind == "cgroup2" else "memory.max_usage_in_bytes"
        return TreeUsage(peak_memory_bytes=_read_int(os.path.join(self.memory_dir, memory_file)),
                         peak_processes=_read_int(os.path.join(self.pids_dir, "pids.peak")))


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path).strip())
    except FileNotFoundError:
        return None


@contextmanager
def run_cgroups(caps: TreeCaps) -> Iterator[RunCgroups | None]:
    """Fresh parent cgroups for one run, removed afterwards; yields None when ``caps`` is ``none``."""
    if not caps.capped:
        yield None
        return
    assert caps.memory_base is not None and caps.pids_base is not None
    name = run_cgroup_name()
    dirs = [os.path.join(caps.memory_base, name)]
    if caps.pids_base != caps.memory_base:
        dirs.append(os.path.join(caps.pids_base, name))
    created: list[str] = []
    try:
        for path in dirs:
            try:
                os.mkdir(path)
            except OSError as exc:
                raise RunCgroupError(f"cannot create the run's cgroup {path}: {exc.strerror}") from exc
            created.append(path)
        yield RunCgroups(caps=caps, memory_dir=dirs[0], pids_dir=dirs[-1])
    finally:
        for path in created:
            remove_cgroup_tree(path)


def remove_cgroup_tree(path: str, timeout_s: float = _REMOVE_TIMEOUT_S) -> bool:
    """Kill whatever still runs in ``path`` or below, then remove the directories, deepest first.

    Processes of a killed jail leave the cgroup a moment after they die, so removal is retried until ``timeout_s``;
    a tree that cannot be removed by then is logged with its path (and left for :func:`sweep_stale_run_cgroups`).
    """
    deadline = time.monotonic() + timeout_s
    for entry in _subdirs(path):
        remove_cgroup_tree(entry, max(0.0, deadline - time.monotonic()))
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                logger.warning("cannot remove sandbox cgroup %s: %s", path, exc)
                return False
        _kill_members(path)
        if time.monotonic() > deadline:
            logger.warning("sandbox cgroup %s still has processes after %.0f s; left in place", path, timeout_s)
            return False
        time.sleep(_REMOVE_POLL_S)


def _subdirs(path: str) -> list[str]:
    try:
        return [entry.path for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _kill_members(path: str) -> None:
    """SIGKILL the processes listed in the cgroup (only jailed processes are ever put in a run's cgroups)."""
    try:
        pids = [int(pid) for pid in _read(os.path.join(path, "cgroup.procs")).split()]
    except FileNotFoundError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def sweep_stale_run_cgroups(caps: TreeCaps) -> list[str]:
    """Remove per-run cgroups whose creating process (of this PID namespace) no longer exists; returns those removed."""
    removed: list[str] = []
    namespace = _pid_namespace()
    bases = {caps.memory_base, caps.pids_base} - {None}
    for base in sorted(b for b in bases if b is not None):
        for path in _subdirs(base):
            match = _RUN_NAME.match(os.path.basename(path))
            if match is None or int(match.group(1)) != namespace or process_exists(int(match.group(2))):
                continue
            if remove_cgroup_tree(path, timeout_s=0.5):
                removed.append(path)
    return removed
