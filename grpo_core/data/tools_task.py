"""The built-in tool-use task: products of two 3-digit numbers, for the multi-turn CPU demo (`make run-tools`).

Why this task: the tiny policy cannot multiply 3-digit numbers (a 6-digit product is out of reach of a 0.6M model
trained for a minute), but it can copy: write ``<calculator>347 * 829</calculator>``, read the tool's ``287663`` and
answer ``\\boxed{287663}``. So the reward is reachable only through the tool, and what GRPO has to learn is *when* to
call it, a decision the warm-up leaves mostly to answering directly (grpo_core/lifecycle/model/tiny_tools.py).

Rows use the math data format: ``{"messages": {"role": "user", "content": "What is 347 * 829?"},
"gt_answer": "287663"}``; the split is a pure function of the seed and no operand pair is in both splits.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from grpo_core.data.splits import write_jsonl_splits

SPLITS = ("train", "eval")
OPERANDS = range(100, 1000)
TRAIN_SIZE = 4000
EVAL_SIZE = 96
DEFAULT_SEED = 0
_QUESTION = re.compile(r"^What is (\d+) \* (\d+)\?$")


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}?"


def parse_question(text: str) -> tuple[int, int]:
    """The operands of a prompt written by `question`."""
    m = _QUESTION.match(text.strip())
    if m is None:
        raise ValueError(f"not a product question of the form 'What is A * B?': {text!r}")
    return int(m.group(1)), int(m.group(2))


def split_pairs(seed: int = DEFAULT_SEED) -> dict[str, list[tuple[int, int]]]:
    """Distinct operand pairs drawn with a seeded generator: the first EVAL_SIZE for eval, the next TRAIN_SIZE for
    train."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    pairs: list[tuple[int, int]] = []
    while len(pairs) < EVAL_SIZE + TRAIN_SIZE:
        pair = (rng.choice(OPERANDS), rng.choice(OPERANDS))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return {"eval": pairs[:EVAL_SIZE], "train": pairs[EVAL_SIZE:]}


def make_rows(split: str, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return [{"messages": {"role": "user", "content": question(a, b)}, "gt_answer": str(a * b)}
            for a, b in split_pairs(seed)[split]]


def write_splits(out_dir: str | Path, seed: int = DEFAULT_SEED) -> dict[str, Path]:
    return write_jsonl_splits(out_dir, SPLITS, lambda split: make_rows(split, seed))


if __name__ == "__main__":
    for name, p in write_splits("data/tools").items():
        print(name, p)
