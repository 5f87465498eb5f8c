"""Behaviour of the sandbox API: running programs, limits, verdicts, output comparison, refusing when unavailable."""

from __future__ import annotations

import os

import pytest

from grpo_core.infra.sandbox import (
    RunResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    TestOutcome,
    check_tests,
    normalize_output,
    outputs_match,
)
from grpo_core.infra.sandbox.nsjail import read_verdict
from tests.jail import jailed_processes

# 300 s: a test may first wait for another module's jails to end (tests/jail.py)
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("jail_to_ourselves")]

LIMITS = SandboxLimits(cpu_time_s=2, wall_time_s=4)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    try:
        return Sandbox(LIMITS)
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")


# ---- output comparison (no jail needed) ----

def test_normalize_strips_trailing_whitespace_and_blank_lines() -> None:
    assert normalize_output("1 2  \n3\t\n\n\n") == "1 2\n3"
    assert normalize_output("a\r\nb\r\n") == "a\nb"
    assert outputs_match("42\n", "42")
    assert outputs_match("", "\n\n")


def test_normalize_keeps_leading_and_inner_whitespace_and_case() -> None:
    assert not outputs_match(" 42", "42")
    assert not outputs_match("1  2", "1 2")
    assert not outputs_match("Yes", "YES")
    assert not outputs_match("1\n\n2", "1\n2")


def test_limits_validation() -> None:
    with pytest.raises(ValueError, match="cpu_time_s"):
        SandboxLimits(cpu_time_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=16)
    with pytest.raises(ValueError, match="max_cpus"):
        SandboxLimits(max_cpus=-1)
    assert SandboxLimits(cpu_time_s=1.2).cpu_time_whole_s == 2
    assert SandboxLimits(max_file_bytes=1).file_size_mb == 1


def test_read_verdict_parses_nsjail_log() -> None:
    log = (
        "[I][x] Executing '/usr/bin/python3.11' for '[STANDALONE MODE]'\n"
        "[I][x] pid=5 ([STANDALONE MODE]) terminated with signal: SIGKILL (9), (PIDs left: 0)\n"
    )
    verdict = read_verdict(log)
    assert verdict.started and verdict.signal == 9 and verdict.exit_code is None
    verdict = read_verdict("[I][x] Executing 'p'\n[I][x] pid=5 (x) exited with status: 3, (PIDs left: 0)\n")
    assert verdict.exit_code == 3 and verdict.signal is None
    assert not read_verdict("[E] Failed to build mount tree\n").started


# ---- refusing when no jail can start ----

def test_missing_nsjail_binary_raises_unavailable(tmp_path) -> None:
    with pytest.raises(SandboxUnavailable, match="not an executable"):
        Sandbox(LIMITS, nsjail=str(tmp_path / "no-such-nsjail"))


def test_broken_nsjail_raises_unavailable_not_runs_unsandboxed(tmp_path) -> None:
    fake = tmp_path / "nsjail"
    marker = tmp_path / "ran-unsandboxed"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 255\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match="did not start"):
        Sandbox(LIMITS, nsjail=str(fake))
    assert marker.exists()  # the fake was called, and its failure was reported, not papered over


def test_missing_python_raises_unavailable(tmp_path) -> None:
    with pytest.raises(SandboxUnavailable, match="not executable"):
        Sandbox(LIMITS, python=str(tmp_path / "python9"))


# ---- running programs ----

def test_echo_roundtrip(sandbox: Sandbox) -> None:
    result = sandbox.run("print(input()[::-1])", stdin="abc\n")
    assert isinstance(result, RunResult)
    assert result.ok and result.stdout == "cba\n" and result.stderr == ""
    assert result.exit_code == 0 and result.signal is None
    assert not (result.timed_out or result.output_truncated or result.memory_exceeded)
    assert 0 < result.wall_s < LIMITS.wall_time_s


def test_large_stdin_and_unicode(sandbox: Sandbox) -> None:
    data = "héllo wörld ✓\n" * 50_000  # about 0.8 MB
    result = sandbox.run("import sys\nd = sys.stdin.read()\nprint(len(d), d[:13])", stdin=data)
    assert result.ok, result.stderr
    assert result.stdout == f"{len(data)} héllo wörld ✓\n"


def test_exit_status_and_stderr(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert result.exit_code == 3 and result.signal is None and not result.ok
    assert result.stderr == "oops\n"
    # 137 is a legal exit status, not a SIGKILL: the verdict comes from nsjail's log, not 128+N guessing
    result = sandbox.run("raise SystemExit(137)")
    assert result.exit_code == 137 and result.signal is None


def test_exit_builtin_and_runtime_error(sandbox: Sandbox) -> None:
    assert sandbox.run("print(1)\nexit()\nprint(2)").stdout == "1\n"
    result = sandbox.run("1/0")
    assert result.exit_code == 1 and "ZeroDivisionError" in result.stderr


def test_unprivileged_clean_env_private_cwd(sandbox: Sandbox) -> None:
    program = (
        "import os\n"
        "print(os.getuid(), os.getgid(), os.getcwd())\n"
        "print(sorted(os.environ))\n"
        "open('scratch.txt', 'w').write('x' * 1000)\n"
        "print(os.path.getsize('scratch.txt'))\n"
    )
    result = sandbox.run(program)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == ["65534 65534 /tmp", "['HOME', 'LANG', 'PATH']", "1000"]


def test_runs_do_not_share_files(sandbox: Sandbox) -> None:
    first = sandbox.run("open('/tmp/state', 'w').write('from run 1')\nprint('written')")
    assert first.ok, first.stderr
    second = sandbox.run("import os\nprint(os.path.exists('/tmp/state'), os.listdir('/tmp'))")
    assert second.stdout == "False []\n"


def test_file_size_and_tmpfs_limits(sandbox: Sandbox) -> None:
    # RLIMIT_FSIZE (16 MiB) stops a big file; the program sees the error instead of filling host memory
    program = (
        "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "try:\n    open('big', 'wb').write(b'x' * (64 * 2**20))\n    print('wrote')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    result = sandbox.run(program)
    assert result.stdout.startswith("refused"), (result.stdout, result.stderr)


def test_cpu_limit_kills_busy_loop() -> None:
    # a wall limit far above the CPU limit, so that on a loaded machine it is still the CPU limit that fires
    limits = SandboxLimits(cpu_time_s=1, wall_time_s=10)
    result = Sandbox(limits).run("while True:\n    pass")
    assert result.signal == 9 and result.exit_code is None and not result.timed_out
    assert result.wall_s < limits.wall_time_s


def test_wall_limit_kills_sleeper(sandbox: Sandbox) -> None:
    result = sandbox.run("import time\nprint('start', flush=True)\ntime.sleep(60)")
    assert result.timed_out and result.signal == 9
    assert result.stdout == "start\n"  # output produced before the kill is kept
    assert LIMITS.wall_time_s <= result.wall_s < LIMITS.wall_time_s + 1.0


def test_memory_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("x = bytearray(2 * 2**30)\nprint('allocated')")
    assert result.memory_exceeded and result.exit_code == 1 and "allocated" not in result.stdout


def test_output_cap(sandbox: Sandbox) -> None:
    limits = SandboxLimits(max_output_bytes=1000)
    small = Sandbox(limits)
    result = small.run("print('y' * 999)")  # 1000 bytes with the newline: at the cap, not over it
    assert result.ok and len(result.stdout) == 1000 and not result.output_truncated
    result = small.run("print('y' * 1000)")
    assert result.output_truncated and len(result.stdout) == 1000 and result.signal == 9


# ---- check_tests ----

A_PLUS_B = "a, b = map(int, input().split())\nprint(a + b)"


def test_check_tests_all_pass(sandbox: Sandbox) -> None:
    outcome = check_tests(A_PLUS_B, ["1 2\n", "-5 5\n", "10 20"], ["3", "0\n", "30  \n\n"], sandbox=sandbox)
    assert outcome == TestOutcome(passed=True, n_passed=3, n_total=3, reason=None)


def test_check_tests_wrong_answer_stops_early(sandbox: Sandbox) -> None:
    outcome = check_tests(A_PLUS_B, ["1 2", "2 2", "3 3"], ["3", "5", "6"], sandbox=sandbox)
    assert not outcome.passed and outcome.n_passed == 1 and outcome.n_total == 3
    assert outcome.reason == "test 1: wrong answer"
    outcome = check_tests(
        A_PLUS_B, ["1 2", "2 2", "3 3"], ["3", "5", "6"], sandbox=sandbox, stop_on_first_failure=False
    )
    assert not outcome.passed and outcome.n_passed == 2 and outcome.reason == "test 1: wrong answer"


def test_check_tests_reasons(sandbox: Sandbox) -> None:
    crash = check_tests("raise ValueError('bad input')", ["x"], ["x"], sandbox=sandbox)
    assert not crash.passed and "runtime error" in crash.reason and "ValueError: bad input" in crash.reason
    slow = check_tests("while True: pass", ["x"], ["x"], sandbox=sandbox)
    assert not slow.passed and "time limit exceeded" in slow.reason  # CPU or, on a loaded machine, wall


def test_check_tests_builds_its_own_sandbox_from_limits() -> None:
    try:
        outcome = check_tests(A_PLUS_B, ["1 1"], ["2"], SandboxLimits(cpu_time_s=1, wall_time_s=2))
    except SandboxUnavailable as exc:
        pytest.skip(f"nsjail cannot run here: {exc}")
    assert outcome.passed


def test_check_tests_rejects_bad_arguments(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError, match="2 inputs but 1"):
        check_tests(A_PLUS_B, ["1 1", "2 2"], ["2"], sandbox=sandbox)
    with pytest.raises(ValueError, match="no test cases"):
        check_tests(A_PLUS_B, [], [], sandbox=sandbox)


def test_no_leftover_jail_processes(sandbox: Sandbox) -> None:
    sandbox.run("import os, time\nfor _ in range(5):\n    os.fork() or time.sleep(60)\ntime.sleep(60)")
    assert jailed_processes() == []


def test_interpreter_in_private_directory_is_refused(tmp_path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    wrapper = private / "python3"
    wrapper.write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    wrapper.chmod(0o755)
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3")
    with pytest.raises(SandboxUnavailable, match="not traversable"):
        Sandbox(LIMITS, python=str(wrapper))


def test_one_sandbox_serves_concurrent_threads(sandbox: Sandbox) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: sandbox.run("print(int(input()) * 2)", stdin=f"{i}\n"), range(8)))
    assert [r.stdout for r in results] == [f"{2 * i}\n" for i in range(8)]
