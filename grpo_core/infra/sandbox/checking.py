"""Judge a program against input/output test cases, each case in its own jail.

Output comparison follows the usual competitive-programming rule: trailing whitespace at the end of each line and
trailing blank lines at the end of the output are ignored (so ``"1 \\n2\\n\\n"`` equals ``"1\\n2"``); everything else,
leading whitespace, inner spaces and letter case included, must match exactly. Line endings ``\\r\\n`` count as
``\\n`` (``\\r`` is trailing whitespace).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_core.infra.sandbox.limits import SandboxLimits
from grpo_core.infra.sandbox.runner import RunResult, Sandbox

_STDERR_TAIL = 300


@dataclass
class TestOutcome:
    """passed: every case ran (or, with stop_on_first_failure, every case up to the first failure) and matched.
    reason: None when passed, else why the first failing case failed ("test 3: wrong answer", ...)."""

    __test__ = False  # not a pytest test class

    passed: bool
    n_passed: int
    n_total: int
    reason: str | None


def normalize_output(text: str) -> str:
    """Strip trailing whitespace on each line and trailing blank lines (see the module docstring)."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def outputs_match(actual: str, expected: str) -> bool:
    return normalize_output(actual) == normalize_output(expected)


def failure_reason(result: RunResult) -> str | None:
    """Why a run cannot count as correct regardless of its output, or None if it finished cleanly."""
    if result.timed_out:
        return "time limit exceeded (wall clock)"
    if result.output_truncated:
        return "output limit exceeded"
    if result.memory_exceeded:
        return "memory limit exceeded"
    if result.signal in (9, 24):  # SIGKILL/SIGXCPU with no wall timeout or output cap: RLIMIT_CPU fired
        return f"time limit exceeded (CPU, signal {result.signal})"
    if result.signal is not None:
        return f"killed by signal {result.signal}"
    if result.exit_code != 0:
        tail = result.stderr.strip()[-_STDERR_TAIL:]
        return f"runtime error (exit code {result.exit_code}): {tail}" if tail else f"exit code {result.exit_code}"
    return None


def check_tests(
    program: str,
    inputs: list[str],
    outputs: list[str],
    limits: SandboxLimits | None = None,
    *,
    stop_on_first_failure: bool = True,
    sandbox: Sandbox | None = None,
) -> TestOutcome:
    """Run ``program`` on each input in a fresh jail and compare with the expected output.

    Pass ``sandbox`` to reuse a checked :class:`Sandbox` (saves its start-up self-check); otherwise one is built from
    ``limits`` and :class:`SandboxUnavailable` propagates if none can start. Zero test cases is an error, not a pass.
    """
    if len(inputs) != len(outputs):
        raise ValueError(f"check_tests: {len(inputs)} inputs but {len(outputs)} expected outputs")
    if not inputs:
        raise ValueError("check_tests: no test cases")
    if sandbox is None:
        sandbox = Sandbox(limits if limits is not None else SandboxLimits())
    elif limits is not None and limits != sandbox.limits:
        raise ValueError("check_tests: pass either limits or a sandbox built with them, not conflicting both")
    n_passed = 0
    first_reason: str | None = None
    for index, (stdin, expected) in enumerate(zip(inputs, outputs)):
        result = sandbox.run(program, stdin)
        reason = failure_reason(result)
        if reason is None and not outputs_match(result.stdout, expected):
            reason = "wrong answer"
        if reason is None:
            n_passed += 1
            continue
        if first_reason is None:
            first_reason = f"test {index}: {reason}"
        if stop_on_first_failure:
            break
    return TestOutcome(passed=n_passed == len(inputs), n_passed=n_passed, n_total=len(inputs), reason=first_reason)
