"""Sandbox overhead per test case: a trivial program run in nsjail vs the same interpreter run directly.

Prints figures; not a test. Usage: python benchmarks/code_scoring.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from grpo_core.infra.sandbox import Sandbox, SandboxLimits, check_tests

PROGRAM = "print(input())\n"


def time_direct(python: str, runs: int) -> list[float]:
    """The program's own cost: the same interpreter and flags, no jail."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "main.py"
        path.write_text(PROGRAM)
        samples = []
        for _ in range(runs):
            start = time.monotonic()
            out = subprocess.run([python, "-I", "-B", str(path)], input="hello\n", capture_output=True, text=True)
            samples.append(time.monotonic() - start)
            assert out.stdout == "hello\n", out
    return samples


def time_sandboxed(sandbox: Sandbox, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.monotonic()
        result = sandbox.run(PROGRAM, "hello\n")
        samples.append(time.monotonic() - start)
        assert result.ok and result.stdout == "hello\n", result
    return samples


def describe(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[int(0.9 * (len(ms) - 1))]
    return f"{name:<22} median {statistics.median(ms):6.1f} ms   p90 {p90:6.1f} ms   min {ms[0]:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    start = time.monotonic()
    sandbox = Sandbox(SandboxLimits())
    print(f"Sandbox() with self-check: {(time.monotonic() - start) * 1000:.1f} ms")
    python = sandbox.layout.executable
    print(f"interpreter: {python}   nsjail: {sandbox.nsjail}")

    time_sandboxed(sandbox, 3)  # warm page cache
    direct = time_direct(python, args.runs)
    jailed = time_sandboxed(sandbox, args.runs)
    print(describe("direct python", direct))
    print(describe("sandboxed (nsjail)", jailed))
    overhead = statistics.median(jailed) - statistics.median(direct)
    print(f"overhead per test case (median difference): {overhead * 1000:.1f} ms")

    cases = 10
    inputs = [f"{i} {i}\n" for i in range(cases)]
    outputs = [f"{2 * i}\n" for i in range(cases)]
    program = "a, b = map(int, input().split())\nprint(a + b)\n"
    start = time.monotonic()
    outcome = check_tests(program, inputs, outputs, sandbox=sandbox)
    elapsed = time.monotonic() - start
    assert outcome.passed, outcome
    print(f"check_tests, {cases} cases: {elapsed * 1000:.0f} ms ({elapsed / cases * 1000:.1f} ms a case)")


if __name__ == "__main__":
    main()
