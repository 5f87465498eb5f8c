"""Where the test suite's time goes, per module, from pytest's JUnit XML (each test case's set-up + call + tear-down).

    make test PYTEST_ARGS="--junitxml=/tmp/test.xml"            # or make test-e2e
    .venv/bin/python benchmarks/test_durations.py /tmp/test.xml [--before /tmp/old.xml] [--top 25]

Prints a Markdown table (module, tests, seconds, share; with --before, the earlier seconds beside them) and the
wall time the XML records. Under pytest-xdist the per-module seconds add up over the workers, so their sum exceeds
the wall time; module-scoped fixtures (a reference run, a model build) count in the first test that uses them.
"""
from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET


def per_module(path: str) -> tuple[dict[str, float], dict[str, int], float]:
    """(seconds per module, tests per module, the suite's wall seconds) of one JUnit XML file."""
    root = ET.parse(path).getroot()
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    for case in root.iter("testcase"):
        module = case.get("classname", "?").split(".")[-1]
        if module.startswith("Test"):  # a test class: its module is the part before
            module = case.get("classname", "?").split(".")[-2]
        seconds[module] += float(case.get("time") or 0.0)
        counts[module] += 1
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return dict(seconds), dict(counts), float(suite.get("time") or 0.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml")
    parser.add_argument("--before", help="an earlier run's XML, shown beside")
    parser.add_argument("--top", type=int, default=0, help="only the N slowest modules (0: all)")
    args = parser.parse_args(argv)
    seconds, counts, wall = per_module(args.xml)
    before = per_module(args.before) if args.before else None
    modules = sorted(set(seconds) | set(before[0] if before else ()), key=lambda m: -seconds.get(m, 0.0))
    total = sum(seconds.values())
    shown = modules[:args.top] if args.top else modules
    head = "| module | tests | s | share |" + (" s before |" if before else "")
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for m in shown:
        row = f"| {m} | {counts.get(m, 0)} | {seconds.get(m, 0.0):.1f} | {seconds.get(m, 0.0) / total:.1%} |"
        if before:
            row += f" {before[0].get(m, 0.0):.1f} |" if m in before[0] else " - |"
        print(row)
    rest = modules[len(shown):]
    if rest:
        print(f"| {len(rest)} others | {sum(counts.get(m, 0) for m in rest)} | "
              f"{sum(seconds.get(m, 0.0) for m in rest):.1f} | |" + (" |" if before else ""))
    line = f"\nsum over tests {total:.0f} s; wall {wall:.0f} s"
    if before:
        line += f" (before: sum {sum(before[0].values()):.0f} s, wall {before[2]:.0f} s)"
    print(line)


if __name__ == "__main__":
    main()
