"""Limits that hold for a sandboxed run as a whole: memory and process count of its whole process tree (cgroups), the
seccomp filter, the cgroups' clean-up, which mechanism is picked on which host, and the memory budget of concurrent
runs against the machine."""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys

import pytest

from grpo_core.infra.sandbox import Sandbox, SandboxLimits, TreeCaps, detect_tree_caps, memory_budget
from grpo_core.infra.sandbox.cgroups import RUN_PREFIX, run_cgroups
from grpo_core.infra.sandbox.limits import GIB, MIB, machine_memory_bytes
from tests.jail import fork_bomb, jailed_processes

# 300 s: a test may first wait for another module's jails to end (tests/jail.py)
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("jail_to_ourselves")]

# The run's parent cgroup may hold a few pages charged to it directly besides the jail's (kernel objects of the
# jail's own cgroup): the measured peak may pass the cap by that much, never by a process's worth.
CHARGE_SLACK = MIB

# Each child allocates and touches `mib` MiB, holds it a moment, and reports; the parent reports every child's fate.
CHILDREN_ALLOCATE = """
import os, time
n, mib = {n}, {mib}
kids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            block = bytearray(mib * 2**20)
            for j in range(0, len(block), 4096):
                block[j] = 1
            print('child', i, 'holds', mib, flush=True)
            time.sleep(3)  # hold it while the others allocate
        except MemoryError:
            print('child', i, 'MemoryError', flush=True)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    _, status = os.waitpid(pid, 0)
    print('status', os.WTERMSIG(status) if os.WIFSIGNALED(status) else 'exit', flush=True)
"""


def _host_mounts_a_memory_cgroup() -> bool:
    """Read apart from the code under test: whether this host mounts a cgroup memory controller at all (v1's
    ``memory`` hierarchy, or a v2 hierarchy offering ``memory``). Only a host without one may go uncapped."""
    try:
        mounts = [line.split() for line in open("/proc/mounts")]
    except OSError:
        return False
    for _dev, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "memory" in options.split(","):
            return True
        if kind == "cgroup2" and "memory" in _read(os.path.join(where, "cgroup.controllers")).split():
            return True
    return False


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _tree_caps_or_skip(caps: TreeCaps) -> None:
    """A host that mounts no memory cgroup cannot cap a tree (a reason to skip); one that does must be capped, so a
    detection that broke fails here instead of skipping."""
    if caps.capped:
        return
    if _host_mounts_a_memory_cgroup():
        pytest.fail(f"this host mounts a memory cgroup, yet no run's tree is capped: {caps.reason}")
    pytest.skip(f"this host mounts no cgroup memory controller: {caps.reason}")


def _capped_sandbox(limits: SandboxLimits) -> Sandbox:
    """nsjail must run here as the rest of the sandbox tests need it (root on Linux); its absence is a failure."""
    sandbox = Sandbox(limits)
    _tree_caps_or_skip(sandbox.tree_caps)
    return sandbox


def _fates(stdout: str) -> tuple[int, int]:
    """(children that held their block, children killed by SIGKILL)."""
    return len(re.findall(r"^child \d+ holds", stdout, re.M)), len(re.findall(r"^status 9$", stdout, re.M))


def _own_run_cgroups(caps: TreeCaps) -> list[str]:
    """Per-run cgroups this test process created that still exist."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    mine = f"{RUN_PREFIX}{ns}-{os.getpid()}-"
    return [os.path.join(base, name) for base in {caps.memory_base, caps.pids_base} if base
            for name in os.listdir(base) if name.startswith(mine)]


# ---- memory of the whole tree ----

def test_six_children_together_stay_under_the_memory_cap() -> None:
    # 6 x 300 MiB: each child is far under RLIMIT_AS (1024 MiB), only a cap on the whole tree can stop them
    limits = SandboxLimits(cpu_time_s=5, wall_time_s=30, memory_mb=1024)
    sandbox = _capped_sandbox(limits)
    result = sandbox.run(CHILDREN_ALLOCATE.format(n=6, mib=300))
    held, killed = _fates(result.stdout)
    assert result.peak_memory_bytes is not None, result
    print(f"6 x 300 MiB under a 1024 MiB cap: peak {result.peak_memory_bytes} bytes "
          f"({result.peak_memory_bytes / MIB:.2f} MiB), {held} held, {killed} OOM-killed")
    assert result.peak_memory_bytes <= limits.memory_bytes + CHARGE_SLACK
    assert result.peak_memory_bytes >= 900 * MIB  # the tree did push up to the cap
    assert killed >= 3 and held + killed >= 6, result.stdout  # at most 3 blocks of 300 MiB fit in 1024 MiB
    assert result.exit_code == 0  # the parent, small, survived and saw its children killed


def test_without_a_cgroup_the_same_tree_passes_the_cap_and_the_log_says_so(caplog) -> None:
    # The fallback (rlimits per process): 4 x 100 MiB all succeed under memory_mb=256. With the cgroup, they cannot.
    limits = SandboxLimits(cpu_time_s=3, wall_time_s=20, memory_mb=256)
    program = CHILDREN_ALLOCATE.format(n=4, mib=100)
    capped = _capped_sandbox(limits).run(program)
    held, killed = _fates(capped.stdout)
    assert killed >= 2 and capped.peak_memory_bytes <= limits.memory_bytes + CHARGE_SLACK, capped

    with caplog.at_level(logging.WARNING, logger="grpo_core.infra.sandbox.runner"):
        uncapped_sandbox = Sandbox(limits, tree_caps=TreeCaps(kind="none", reason="test: cgroups not used"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "test: cgroups not used" in warnings[0] and "per process only" in warnings[0]
    uncapped = uncapped_sandbox.run(program)
    assert _fates(uncapped.stdout) == (4, 0) and uncapped.peak_memory_bytes is None, uncapped


def test_tmpfs_files_count_toward_the_cap_and_mark_the_run_memory_exceeded() -> None:
    # tmpfs pages escape RLIMIT_AS but not the cgroup: 200 MiB of files under a 128 MiB cap
    limits = SandboxLimits(cpu_time_s=3, wall_time_s=20, memory_mb=128, tmpfs_bytes=512 * MIB)
    sandbox = _capped_sandbox(limits)
    program = (
        "block = b'x' * (8 * 2**20)\n"
        "for i in range(25):\n"
        "    with open(f'/tmp/f{i}', 'wb') as fh:\n"
        "        fh.write(block)\n"
        "    print('wrote', i, flush=True)\n"
    )
    result = sandbox.run(program)
    assert "wrote 24" not in result.stdout
    assert not result.ok and result.memory_exceeded, result
    assert result.peak_memory_bytes <= limits.memory_bytes + CHARGE_SLACK


# ---- processes of the whole tree ----

def test_fork_bomb_stops_at_the_process_cap() -> None:
    limits = SandboxLimits(cpu_time_s=2, wall_time_s=6, max_processes=12)
    sandbox = _capped_sandbox(limits)
    program = fork_bomb(500)
    result = sandbox.run(program)
    assert result.stdout.startswith("forked "), result
    forked = int(result.stdout.split()[1])
    print(f"fork bomb with max_processes=12: forked {forked}, tree peak {result.peak_processes} processes")
    assert forked == limits.max_processes - 1  # 500 tries: the program itself plus 11 children
    assert result.peak_processes == limits.max_processes
    assert jailed_processes() == []


# ---- seccomp ----

def test_seccomp_refuses_kernel_surface_with_eperm_and_keeps_fork_and_threads() -> None:
    sandbox = _capped_sandbox(SandboxLimits(cpu_time_s=2, wall_time_s=10))
    program = (
        "import ctypes, errno, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "CLONE_NEWUSER, SIGCHLD = 0x10000000, 17\n"
        "calls = {'unshare': (272, 0), 'unshare_user': (272, CLONE_NEWUSER), 'ptrace_traceme': (101, 0),\n"
        "         'mount': (165, 0), 'umount2': (166, 0), 'setns': (308, 0), 'bpf': (321, 0),\n"
        "         'keyctl': (250, 0), 'perf_event_open': (298, 0), 'userfaultfd': (323, 0),\n"
        "         'process_vm_readv': (310, 1), 'clone_newuser': (56, CLONE_NEWUSER | SIGCHLD),\n"
        "         'getppid': (110, 0)}\n"
        "for name, (nr, arg) in calls.items():\n"
        "    ctypes.set_errno(0)\n"
        "    ret = libc.syscall(nr, ctypes.c_long(arg), 0, 0, 0, 0, 0)\n"
        "    if ret == 0 and name == 'clone_newuser':\n"
        "        os._exit(0)  # had it not been refused, this is the child\n"
        "    print(name, ret, errno.errorcode.get(ctypes.get_errno(), '-'), flush=True)\n"
        "seen = []\n"
        "t = threading.Thread(target=seen.append, args=('thread',))\n"
        "t.start(); t.join()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print(seen[0], os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    result = sandbox.run(program)
    assert result.ok, result
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    for name in ("unshare", "unshare_user", "ptrace_traceme", "mount", "umount2", "setns", "bpf", "keyctl",
                 "perf_event_open", "userfaultfd", "process_vm_readv", "clone_newuser"):
        assert lines[name] == "-1 EPERM", (name, result.stdout)
    assert lines["getppid"] == "0 -"  # an ordinary call goes through (the jail's PID 1 has no visible parent)
    assert lines["thread"] == "7"  # threads (clone3 -> ENOSYS -> clone) and fork still work


# ---- clean-up ----

def test_run_cgroups_are_removed_after_every_kind_of_end() -> None:
    limits = SandboxLimits(cpu_time_s=1, wall_time_s=2, memory_mb=128)
    sandbox = _capped_sandbox(limits)
    assert sandbox.run("print('fine')").ok
    sleeper = sandbox.run("import os, time\nfor _ in range(4):\n    os.fork() or time.sleep(60)\ntime.sleep(60)")
    assert sleeper.timed_out  # nsjail itself was SIGKILLed: its own NSJAIL.<pid> cgroup was ours to remove
    hog = sandbox.run("import os\nos.fork(); os.fork()\nx = bytearray(100 * 2**20)\nimport time; time.sleep(5)")
    assert not hog.ok
    assert _own_run_cgroups(sandbox.tree_caps) == []
    assert jailed_processes() == []


def test_run_cgroups_of_a_dead_process_are_swept() -> None:
    caps = detect_tree_caps()
    _tree_caps_or_skip(caps)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    ns = os.stat("/proc/self/ns/pid").st_ino
    stale = [os.path.join(base, f"{RUN_PREFIX}{ns}-{dead_pid}-abc123") for base in {caps.memory_base, caps.pids_base}]
    for path in stale:
        os.mkdir(path)
        os.mkdir(os.path.join(path, "NSJAIL.1"))  # as a killed nsjail leaves it
    try:
        _capped_sandbox(SandboxLimits())
        assert [path for path in stale if os.path.exists(path)] == []
    finally:
        for path in stale:
            for leftover in (os.path.join(path, "NSJAIL.1"), path):
                if os.path.exists(leftover):
                    os.rmdir(leftover)


# ---- which mechanism, from the host's /proc/self (fake trees: the detection logic, not nsjail) ----

def _fake_proc(tmp_path, mountinfo: list[str], cgroup: list[str], name: str = "proc_self") -> str:
    proc = tmp_path / name
    proc.mkdir()
    (proc / "mountinfo").write_text("\n".join(mountinfo) + "\n")
    (proc / "cgroup").write_text("\n".join(cgroup) + "\n")
    return str(proc)


def test_cgroup2_with_delegated_memory_and_pids_is_preferred(tmp_path) -> None:
    own = tmp_path / "cg2" / "grpo.slice"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory pids\n")
    proc = _fake_proc(tmp_path, [
        f"41 31 0:38 / {tmp_path}/cg2 rw,relatime - cgroup2 cgroup2 rw",
        f"35 31 0:32 / {tmp_path}/v1mem rw,relatime - cgroup cgroup rw,memory",
    ], ["4:memory:/", "0::/grpo.slice"])
    caps = detect_tree_caps(proc)
    assert caps.kind == "cgroup2" and caps.memory_base == caps.pids_base == str(own)
    with run_cgroups(caps) as run:
        args = run.nsjail_args(256 * MIB, 8)
        assert os.path.dirname(run.memory_dir) == str(own)
        assert args == ["--cgroup_mem_max", str(256 * MIB), "--cgroup_pids_max", "8",
                        "--use_cgroupv2", "--cgroupv2_mount", run.memory_dir]
    assert not os.path.exists(run.memory_dir)


def test_cgroup1_below_a_container_root_and_the_reason_when_cgroup2_does_not_delegate(tmp_path) -> None:
    cg2 = tmp_path / "unified"
    cg2.mkdir()
    (cg2 / "cgroup.controllers").write_text("")
    (cg2 / "cgroup.subtree_control").write_text("")
    for name in ("mem", "pids"):
        (tmp_path / name / "job").mkdir(parents=True)
    (tmp_path / "mem" / "job" / "memory.memsw.limit_in_bytes").write_text("0\n")
    mountinfo = [
        f"35 31 0:32 /docker/abc {tmp_path}/mem rw,relatime - cgroup cgroup rw,memory",
        f"39 31 0:36 /docker/abc {tmp_path}/pids rw,relatime - cgroup cgroup rw,pids",
        f"41 31 0:38 / {tmp_path}/unified rw,relatime - cgroup2 cgroup2 rw",
    ]
    proc = _fake_proc(tmp_path, mountinfo, ["4:memory:/docker/abc/job", "8:pids:/docker/abc/job", "0::/"])
    caps = detect_tree_caps(proc)
    assert caps.kind == "cgroup1", caps
    assert caps.memory_base == f"{tmp_path}/mem/job" and caps.pids_base == f"{tmp_path}/pids/job"
    with run_cgroups(caps) as run:
        (tmp_path / "mem" / "job" / os.path.basename(run.memory_dir) / "memory.memsw.limit_in_bytes").write_text("0")
        args = run.nsjail_args(64 * MIB, 4)
        name = os.path.basename(run.memory_dir)
        assert args[args.index("--cgroup_mem_mount") + 1] == f"{tmp_path}/mem"
        assert args[args.index("--cgroup_mem_parent") + 1] == f"job/{name}"
        assert args[args.index("--cgroup_pids_parent") + 1] == f"job/{name}"
        assert args[-2:] == ["--cgroup_mem_swap_max", "0"]  # swap accounted: no growing past the cap into swap
        os.remove(os.path.join(run.memory_dir, "memory.memsw.limit_in_bytes"))

    no_v1 = _fake_proc(tmp_path, mountinfo[2:], ["0::/"], name="proc_self_without_v1")
    caps = detect_tree_caps(no_v1)
    assert caps.kind == "none" and not caps.capped
    assert "does not delegate memory,pids" in caps.reason and "no cgroup v1 memory hierarchy" in caps.reason


# ---- memory budget against the machine ----

def test_default_limits_fit_the_machine_only_with_the_tree_cap() -> None:
    limits = SandboxLimits()
    machine = 24 * GIB
    capped = memory_budget(limits, concurrent_runs=2, tree_capped=True, machine_bytes=machine)
    assert capped.fits and capped.total_bytes == 2 * GIB
    # the finding: per-process rlimits only, one default run could hold 32 x 1 GiB (+ its tmpfs)
    uncapped = memory_budget(limits, concurrent_runs=2, tree_capped=False, machine_bytes=machine)
    assert not uncapped.fits and uncapped.per_run_bytes == 32 * GIB + 32 * MIB
    with pytest.raises(ValueError, match="concurrent_runs"):
        memory_budget(limits, concurrent_runs=0, tree_capped=True, machine_bytes=machine)


def test_too_many_concurrent_runs_for_the_machine_is_a_clear_error() -> None:
    caps = detect_tree_caps()
    _tree_caps_or_skip(caps)
    limits = SandboxLimits()
    too_many = math.ceil(machine_memory_bytes() / limits.memory_bytes) + 1
    with pytest.raises(ValueError, match=r"sandbox memory: .*memory_mb.*reward.num_workers"):
        Sandbox(limits, concurrent_runs=too_many)
