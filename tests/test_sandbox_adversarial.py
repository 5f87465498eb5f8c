"""Hostile programs: each test asserts the attack was contained, not merely that nothing crashed.

Limits are kept small (1 s CPU, 2-3 s wall) so the bombs cost little on a shared machine.
"""

from __future__ import annotations

import os
import resource
import socket

import pytest

from grpo_core.infra.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, check_tests
from tests.jail import fork_bomb, jailed_processes

# 300 s: a test may first wait for another module's jails to end (tests/jail.py)
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("jail_to_ourselves")]

LIMITS = SandboxLimits(cpu_time_s=1, wall_time_s=3, max_processes=32)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    try:
        return Sandbox(LIMITS)
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")


def test_no_network_not_even_host_loopback(sandbox: Sandbox) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    program = (
        "import socket\n"
        "for host in ('127.0.0.1', 'localhost', '10.0.0.1', '1.1.1.1'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=0.5).sendall(b'leak')\n"
        "        print(host, 'CONNECTED')\n"
        "    except OSError as e:\n"
        "        print(host, 'blocked', type(e).__name__)\n"
    )
    try:
        result = sandbox.run(program)
        with pytest.raises(TimeoutError):
            conn, _ = listener.accept()
            conn.close()
    finally:
        listener.close()
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("blocked") == 4, result.stdout + result.stderr


def test_cannot_write_host_files(sandbox: Sandbox, tmp_path) -> None:
    tmp_path.chmod(0o777)  # world-writable: only the jail, not file permissions, stops the write
    target = tmp_path / "target.txt"
    target.write_text("original")
    target.chmod(0o666)
    created = tmp_path / "created.txt"
    host_tmp_marker = f"/tmp/grpo-sandbox-escape-{os.getpid()}"
    program = (
        "import os\n"
        f"for path in ({str(target)!r}, {str(created)!r}, {host_tmp_marker!r}, '/usr/lib/pwned', '/pwned'):\n"
        "    try:\n"
        "        with open(path, 'w') as fh:\n"
        "            fh.write('PWNED')\n"
        "        print(path, 'written')\n"
        "    except OSError as e:\n"
        "        print(path, 'refused', e.errno)\n"
    )
    result = sandbox.run(program)
    assert result.exit_code == 0, result.stderr
    assert target.read_text() == "original"
    assert not created.exists()
    assert not os.path.exists(host_tmp_marker)  # the jail's /tmp is its own tmpfs
    assert not os.path.exists("/usr/lib/pwned") and not os.path.exists("/pwned")
    assert f"{target} refused" in result.stdout and "/usr/lib/pwned refused" in result.stdout


def test_cannot_read_host_files(sandbox: Sandbox, tmp_path) -> None:
    secret = f"SECRET-{os.urandom(8).hex()}"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o644)
    tmp_path.chmod(0o755)
    program = (
        "import os\n"
        f"for path in ({str(secret_file)!r}, '/etc/passwd', '/etc/hostname', '/root/.bashrc',"
        " '/work/main/pyproject.toml', '/proc/1/root/etc/passwd'):\n"
        "    try:\n"
        "        print(path, open(path).read()[:200])\n"
        "    except OSError as e:\n"
        "        print(path, 'refused', type(e).__name__)\n"
        "print(sorted(os.listdir('/')))\n"
        "print(sorted(os.listdir('/usr')))\n"
    )
    result = sandbox.run(program)
    assert result.exit_code == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert all("refused" in line for line in lines[:6]), lines
    assert lines[6] == "['bin', 'code', 'dev', 'lib', 'lib64', 'proc', 'tmp', 'usr']"  # no etc, root, work, home
    assert "local" not in lines[7] and "share" not in lines[7]


def test_cannot_read_host_environment(sandbox: Sandbox, monkeypatch) -> None:
    secret = f"ENVSECRET-{os.urandom(8).hex()}"
    monkeypatch.setenv("GRPO_SANDBOX_TEST_SECRET", secret)
    program = (
        "import os\n"
        "print(dict(os.environ))\n"
        "for path in ('/proc/self/environ', '/proc/1/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
    )
    result = sandbox.run(program)
    assert result.exit_code == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    assert "GRPO_SANDBOX_TEST_SECRET" not in result.stdout


def test_cannot_see_host_processes(sandbox: Sandbox) -> None:
    me = os.getpid()
    program = (
        "import os\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        f"print(os.path.exists('/proc/{me}'))\n"
        "try:\n"
        f"    os.kill({me}, 0)\n"
        "    print('visible')\n"
        "except ProcessLookupError:\n"
        "    print('no such process')\n"
    )
    result = sandbox.run(program)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["[1]", "False", "no such process"]


def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    program = fork_bomb(1500, hold_s=60)
    limits = SandboxLimits(cpu_time_s=2, wall_time_s=6, max_processes=32)  # room to finish 1500 tries under load
    result = Sandbox(limits).run(program)
    assert result.stdout.startswith("forked "), result
    forked = int(result.stdout.split()[1])
    assert forked < limits.max_processes  # the limit held: 1500 attempts, fewer than 32 processes
    assert result.timed_out
    assert jailed_processes() == []  # every forked process died with the jail


def test_exponential_fork_bomb_returns(sandbox: Sandbox) -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run(program)
    assert result.signal == 9 and not result.ok
    assert jailed_processes() == []


def test_memory_bomb_is_killed(sandbox: Sandbox) -> None:
    big = sandbox.run("x = bytearray(8 * 2**30)\nprint('got 8 GiB')")
    assert big.memory_exceeded and "got 8 GiB" not in big.stdout
    # touching pages is slow here (about 1.2 s of CPU per GiB): a 256 MiB cap keeps this light
    small = Sandbox(SandboxLimits(cpu_time_s=2, wall_time_s=3, memory_mb=256))
    program = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 2**20))\n"
    growing = small.run(program)
    assert growing.memory_exceeded and not growing.ok


def test_infinite_loops_are_killed_on_time(sandbox: Sandbox) -> None:
    # CPU-bound loops: the CPU limit fires (the wall limit is set far above it so a loaded machine cannot mask it)
    cpu_bound = Sandbox(SandboxLimits(cpu_time_s=1, wall_time_s=10))
    busy = cpu_bound.run("while True:\n    pass")
    assert busy.signal == 9 and not busy.timed_out and busy.wall_s < 10
    # ignoring SIGXCPU does not help: soft and hard RLIMIT_CPU are equal, so the kernel sends SIGKILL
    stubborn = cpu_bound.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert stubborn.signal == 9 and not stubborn.timed_out and stubborn.wall_s < 10
    # the default sandbox ends a loop whatever it does: by CPU time, or by its wall limit (never before it)
    spin = sandbox.run("while True:\n    pass")
    assert spin.signal == 9 and not spin.ok
    idle = sandbox.run("import time\nwhile True:\n    time.sleep(1)")
    assert idle.timed_out and idle.wall_s >= LIMITS.wall_time_s


def test_output_flood_is_truncated_quickly_without_buffering(sandbox: Sandbox) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for stream in ("stdout", "stderr"):
        program = f"import sys\nblock = 'x' * 2**20\nfor _ in range(500):\n    sys.{stream}.write(block)\n"
        result = sandbox.run(program)  # tries to print 500 MiB
        assert result.output_truncated and result.signal == 9
        assert len(getattr(result, stream)) == LIMITS.max_output_bytes
        assert result.wall_s < 2.0
    peak_growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert peak_growth_mib < 64, f"test process peak RSS grew by {peak_growth_mib:.0f} MiB"


def test_killing_the_parent_does_not_hurt_the_harness(sandbox: Sandbox) -> None:
    program = (
        "import os, signal\n"
        "print('ppid', os.getppid(), flush=True)\n"
        "for target in (os.getppid(), 1, -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError as e:\n"
        "        print(target, type(e).__name__, flush=True)\n"
        "print('still here')\n"
    )
    result = sandbox.run(program)
    assert result.stdout.startswith("ppid 0\n")  # the jail's PID 1 has no visible parent
    assert sandbox.run("print('alive')").stdout == "alive\n"  # the harness and nsjail path still work
    assert jailed_processes() == []


HOSTILE = {
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory bomb": "x = bytearray(16 * 2**30)\n",
    "busy loop": "while True:\n    pass\n",
    "sleeper": "import time\ntime.sleep(600)\n",
    "output flood": "while True:\n    print('z' * 4096)\n",
    "parent killer": "import os\nos.kill(os.getppid(), 9)\nprint('pwned')\n",
    "escape attempt": "import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=0.5)\nprint('pwned')\n",
}
CORRECT = {
    "sum": "a, b = map(int, input().split())\nprint(a + b)\n",
    "sum via stdin": "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
    "sum trailing space": "a, b = map(int, input().split())\nprint(a + b, end=' \\n\\n')\n",
}


def test_batch_of_correct_and_hostile_programs(sandbox: Sandbox) -> None:
    inputs, outputs = ["1 2\n", "40 2\n"], ["3\n", "42\n"]
    programs = [*CORRECT.items(), *HOSTILE.items()]
    programs = [programs[i] for i in (0, 3, 1, 4, 5, 2, 6, 7, 8, 9)]  # interleave
    for name, program in programs:
        outcome = check_tests(program, inputs, outputs, sandbox=sandbox, stop_on_first_failure=False)
        if name in CORRECT:
            assert outcome.passed and outcome.n_passed == 2, (name, outcome)
        else:
            assert not outcome.passed and outcome.n_passed == 0 and outcome.reason, (name, outcome)
    assert jailed_processes() == []
