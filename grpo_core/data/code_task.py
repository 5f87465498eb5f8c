"""The built-in code task: small stdin/stdout programs, for the CPU code-RL demo.

Why this task: the demo must show GRPO teaching a tiny policy to write *programs that pass tests in the sandbox*
within minutes on two CPU cores, and the held-out eval problems must measure a learned rule, not memory. Every
problem combines three parts: how the input is laid out (two integers on one line, or on two lines), an operation on
them (sum, difference, product, larger, smaller) and a constant added to the result::

    Input: two integers a and b on one line. Print the product of a and b plus 7.
    -> a, b = map(int, input().split())
       print(a * b + 7)

The eval split holds (layout, operation, constant) combinations never seen in train, while every layout, operation
and constant occurs in train many times; so a policy that passes held-out problems has learnt to compose the parts.

Rows use the code data format: ``{"messages": {"role": "user", "content": ...}, "test_cases": {"inputs": [...],
"outputs": [...]}}``; each problem has ``TESTS_PER_PROBLEM`` cases with distinct operands (so a wrong operation or a
wrong constant fails). The splits are a pure function of the seed.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_core.data.splits import write_jsonl_splits

SPLITS = ("train", "eval")
# operation -> (English, Python expression)
OPERATIONS: dict[str, tuple[str, str]] = {
    "sum": ("the sum of a and b", "a + b"),
    "difference": ("a minus b", "a - b"),
    "product": ("the product of a and b", "a * b"),
    "max": ("the larger of a and b", "max(a, b)"),
    "min": ("the smaller of a and b", "min(a, b)"),
}
# input layout -> (English, the program's reading lines)
LAYOUTS: dict[str, tuple[str, str]] = {
    "line": ("two integers a and b on one line", "a, b = map(int, input().split())"),
    "lines": ("two integers a and b on two lines", "a = int(input())\nb = int(input())"),
}
CONSTANTS = range(1, 31)
EVAL_SIZE = 60
TESTS_PER_PROBLEM = 3
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Problem:
    layout: str
    operation: str
    constant: int

    def question(self) -> str:
        """The user prompt."""
        return (f"Input: {LAYOUTS[self.layout][0]}. Print {OPERATIONS[self.operation][0]} plus {self.constant}.")

    def program(self, offset: int = 0) -> str:
        """The solution (``offset`` 0) or a program whose constant is off by ``offset`` (the warm-up's near miss)."""
        return f"{LAYOUTS[self.layout][1]}\nprint({OPERATIONS[self.operation][1]} + {self.constant + offset})"

    def response(self, offset: int = 0) -> str:
        """A complete answer: the program in one fenced python block."""
        return f"```python\n{self.program(offset)}\n```"

    def answer(self, a: int, b: int) -> int:
        value = {"sum": a + b, "difference": a - b, "product": a * b, "max": max(a, b), "min": min(a, b)}
        return value[self.operation] + self.constant

    def stdin(self, a: int, b: int) -> str:
        return f"{a} {b}\n" if self.layout == "line" else f"{a}\n{b}\n"


_QUESTION = re.compile(r"^Input: (?P<layout>.+?)\. Print (?P<op>.+) plus (?P<k>\d+)\.$")


def parse_question(text: str) -> Problem:
    """The problem a prompt written by `Problem.question` states."""
    m = _QUESTION.match(text.strip())
    layouts = {v[0]: k for k, v in LAYOUTS.items()}
    ops = {v[0]: k for k, v in OPERATIONS.items()}
    if m is None or m["layout"] not in layouts or m["op"] not in ops:
        raise ValueError(f"not a built-in code problem ('Input: ... Print ... plus K.'): {text!r}")
    return Problem(layouts[m["layout"]], ops[m["op"]], int(m["k"]))


def all_problems() -> list[Problem]:
    return [Problem(lay, op, k) for lay in LAYOUTS for op in OPERATIONS for k in CONSTANTS]


def split_problems(seed: int = DEFAULT_SEED) -> dict[str, list[Problem]]:
    """Problems of each split: a seeded shuffle of all, the first EVAL_SIZE held out for eval."""
    problems = all_problems()
    random.Random(seed).shuffle(problems)
    key = lambda p: (p.layout, p.operation, p.constant)  # noqa: E731
    return {"eval": sorted(problems[:EVAL_SIZE], key=key), "train": problems[EVAL_SIZE:]}


def make_test_cases(problem: Problem, rng: random.Random) -> dict[str, list[str]]:
    """``TESTS_PER_PROBLEM`` cases with distinct operands (a != b, and no pair repeated)."""
    pairs: list[tuple[int, int]] = []
    while len(pairs) < TESTS_PER_PROBLEM:
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        if a != b and (a, b) not in pairs:
            pairs.append((a, b))
    return {"inputs": [problem.stdin(a, b) for a, b in pairs],
            "outputs": [f"{problem.answer(a, b)}\n" for a, b in pairs]}


def make_rows(split: str, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Rows of one split in the code data format; the problems of the two splits are disjoint."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    rng = random.Random(f"{seed}-{split}-tests")
    return [{"messages": {"role": "user", "content": p.question()}, "test_cases": make_test_cases(p, rng)}
            for p in split_problems(seed)[split]]


def write_splits(out_dir: str | Path, seed: int = DEFAULT_SEED) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` under `out_dir`; returns the paths by split."""
    return write_jsonl_splits(out_dir, SPLITS, lambda split: make_rows(split, seed))


if __name__ == "__main__":
    for name, p in write_splits("data/code").items():
        print(name, p)
