"""The built-in verifiable task: small-integer addition, for the CPU demo.

Why this task: a tiny model trained for a minute on two CPU cores must be able to *generalise* to the held-out eval
problems once GRPO has taught it to answer exactly. Two-digit + one-digit addition is decided digit by digit (the
units digit from the two units digits, the tens digit from the tens digit and the carry), and every such digit-level
sub-problem occurs many times in train even though the eval operand pairs never do. So held-out accuracy measures a
learned rule, not memory.

Rows use the math data format: ``{"messages": {"role": "user", "content": "What is 23 + 4?"}, "gt_answer": "27"}``.
The split is a pure function of the seed: the same seed always gives the same rows, and the eval pairs are never in
train.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from grpo_core.data.splits import write_jsonl_splits

SPLITS = ("train", "eval")
LEFT_OPERANDS = range(10, 100)
RIGHT_OPERANDS = range(0, 10)
EVAL_SIZE = 96
DEFAULT_SEED = 0


def question(a: int, b: int) -> str:
    """The user prompt for one problem."""
    return f"What is {a} + {b}?"


_QUESTION = re.compile(r"^What is (\d+) \+ (\d+)\?$")


def parse_question(text: str) -> tuple[int, int]:
    """The operands of a prompt written by `question`."""
    m = _QUESTION.match(text.strip())
    if m is None:
        raise ValueError(f"not an arithmetic question of the form 'What is A + B?': {text!r}")
    return int(m.group(1)), int(m.group(2))


def _all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in LEFT_OPERANDS for b in RIGHT_OPERANDS]


def split_pairs(seed: int = DEFAULT_SEED) -> dict[str, list[tuple[int, int]]]:
    """Operand pairs of each split: a seeded shuffle of all pairs, the first EVAL_SIZE held out for eval."""
    pairs = _all_pairs()
    random.Random(seed).shuffle(pairs)
    return {"eval": sorted(pairs[:EVAL_SIZE]), "train": pairs[EVAL_SIZE:]}


def make_rows(split: str, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Rows of one split (``"train"`` or ``"eval"``) in the math data format; disjoint operand pairs across splits."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return [{"messages": {"role": "user", "content": question(a, b)}, "gt_answer": str(a + b)}
            for a, b in split_pairs(seed)[split]]


def worked_answer(a: int, b: int) -> str:
    """The worked answer SFT teaches (and the real-model demos show as their worked example): the sum written out,
    then the answer in the ``\\boxed{}`` the reward reads."""
    return f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."


def make_conversations(seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """The train split's problems as conversations in the chat format (SFT's data): the question, then the worked
    answer. The eval split stays held out (its problems are never in train)."""
    return [{"messages": [{"role": "user", "content": question(a, b)},
                          {"role": "assistant", "content": worked_answer(a, b)}]}
            for a, b in split_pairs(seed)["train"]]


def write_splits(out_dir: str | Path, seed: int = DEFAULT_SEED) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` under `out_dir`; returns the paths by split."""
    return write_jsonl_splits(out_dir, SPLITS, lambda split: make_rows(split, seed))


def write_conversations(out_dir: str | Path, seed: int = DEFAULT_SEED) -> dict[str, Path]:
    """Write SFT's ``train.jsonl`` (``make_conversations``) under `out_dir`."""
    return write_jsonl_splits(out_dir, ("train",), lambda _split: make_conversations(seed))


if __name__ == "__main__":
    for name, p in write_splits("data/arith").items():
        print(name, p)
    for name, p in write_conversations("data/arith-sft").items():
        print("sft", name, p)
