"""The tiny base's arithmetic family, and the form held out of it that GRPO teaches.

Why a family: `models/tiny` knows one prompt shape (``What is <10..99> + <0..9>?``); a newcomer's own small task
(subtraction, three operands, ``b + a``) starts near 0 there and does not learn. `models/tiny-base` is warmed up on
exact answers of several short forms instead: three operators, two and three operands, symbols and words, small
numbers. What it has not seen is the word ``plus``: ``What is 7 plus 5?`` is the held-out form. Its tokenizer knows
the word as one token (a tokenizer covers words its model was never tuned on, as a real LLM's does), its embedding
is untrained, so the base reads it as one of the operations it knows, mostly not the sum. GRPO then has to teach it
that ``plus`` asks for ``+``, from rewards alone.

Each form's rows are every operand combination in its range (answers never negative); a seeded shuffle puts
``EVAL_PER_FORM`` of them in the eval split. The multiplication table is a table: all of it is in train, and its
eval rows repeat train rows (what it measures is recall, not generalisation). The splits are a pure function of the
seed.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpo_core.data.splits import write_jsonl_splits

SPLITS = ("train", "eval")
EVAL_PER_FORM = 64
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Form:
    """A prompt shape: ``template`` filled with ``operands`` numbers in ``0..high``; ``answer`` of them."""

    template: str
    operands: int
    high: int
    answer: Callable[..., int]
    memorised: bool = False  # a table learnt by heart: its eval rows are train rows

    def rows(self) -> list[tuple[str, int]]:
        """(question, answer) for every operand combination whose answer is not negative."""
        out = []
        for numbers in itertools.product(range(self.high + 1), repeat=self.operands):
            answer = self.answer(*numbers)
            if answer >= 0:
                out.append((self.template.format(*numbers), answer))
        return out


FORMS: dict[str, Form] = {
    "add": Form("What is {} + {}?", 2, 20, lambda a, b: a + b),
    "sub": Form("What is {} - {}?", 2, 20, lambda a, b: a - b),
    "mul": Form("What is {} * {}?", 2, 9, lambda a, b: a * b, memorised=True),
    "add3": Form("What is {} + {} + {}?", 3, 9, lambda a, b, c: a + b + c),
    "sub3": Form("What is {} - {} - {}?", 3, 9, lambda a, b, c: a - b - c),
    "minus": Form("What is {} minus {}?", 2, 20, lambda a, b: a - b),
    "times": Form("What is {} times {}?", 2, 9, lambda a, b: a * b, memorised=True),
    "plus": Form("What is {} plus {}?", 2, 20, lambda a, b: a + b),
}
WARM_UP_FORMS = ("add", "sub", "mul", "add3", "sub3", "minus", "times")
HELD_OUT_FORM = "plus"
# Words the base's tokenizer learns as whole tokens though the warm-up uses only some of them: a newcomer's prompt
# in these words reaches the model as words, not as bytes.
VOCABULARY = ("What is the sum difference product of and plus minus times divided by added to from less more than "
              "twice half").split()
VOCABULARY_REPEATS = 20  # enough occurrences for every word to become one BPE token


def tokenizer_text() -> tuple[str, ...]:
    """Extra text for the base's tokenizer: each word of VOCABULARY in a question, VOCABULARY_REPEATS times."""
    return tuple(f"What is 3 {word} 4?" for word in VOCABULARY) * VOCABULARY_REPEATS


def form_splits(name: str, seed: int = DEFAULT_SEED) -> dict[str, list[tuple[str, int]]]:
    """One form's rows, shuffled with `seed`: the first EVAL_PER_FORM for eval, the rest for train (a memorised
    form's train split holds all of them)."""
    form = FORMS[name]
    rows = form.rows()
    random.Random(f"{seed}:{name}").shuffle(rows)
    return {"eval": rows[:EVAL_PER_FORM], "train": rows if form.memorised else rows[EVAL_PER_FORM:]}


def family_rows(split: str, seed: int = DEFAULT_SEED) -> list[tuple[str, int]]:
    """The warm-up forms' rows of `split`, interleaved by a seeded shuffle (the build checks its first rows)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    rows = [row for name in WARM_UP_FORMS for row in form_splits(name, seed)[split]]
    random.Random(seed).shuffle(rows)
    return rows


def _math_rows(rows: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"messages": {"role": "user", "content": question}, "gt_answer": str(answer)} for question, answer in rows]


def write_splits(family_dir: str | Path, held_out_dir: str | Path,
                 seed: int = DEFAULT_SEED) -> dict[str, dict[str, Path]]:
    """The family's splits under `family_dir` (the base's warm-up) and the held-out form's under `held_out_dir`
    (what GRPO teaches it), in the math format."""
    return {"family": write_jsonl_splits(family_dir, SPLITS, lambda split: _math_rows(family_rows(split, seed))),
            "held_out": write_jsonl_splits(held_out_dir, SPLITS,
                                           lambda split: _math_rows(form_splits(HELD_OUT_FORM, seed)[split]))}


if __name__ == "__main__":
    for group, paths in write_splits("data/arith-family", "data/arith-plus").items():
        for name, path in paths.items():
            print(group, name, path)
