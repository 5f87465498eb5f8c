"""Accuracy: is the completion's final answer right? One function per reward type.

Each returns a ``Verdict`` (1.0 or 0.0 plus an optional note worth keeping, such as why a program failed its tests)
or raises ``RowError`` when the row itself cannot be scored (no gold answer, malformed test cases). It runs inside a
scorer worker process, under that worker's time budget (see ``worker.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_core.rewards.extract import last_answer_tag, last_boxed_content, last_python_block
from grpo_core.rewards.math_equiv import GoldAnswerError, answers_match

REWARD_TYPES = ("boxed", "think_answer_tags", "code")


class RowError(ValueError):
    """The row (its gold answer or test cases) cannot be scored; the message says which field and why."""


@dataclass(frozen=True)
class Verdict:
    value: float
    note: str | None = None


def _gold(row: dict[str, Any], answer_key: str) -> str:
    if answer_key not in row:
        raise RowError(f"row has no {answer_key!r} field (columns: {sorted(row)})")
    gold = row[answer_key]
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        gold = str(gold)
    if not isinstance(gold, str):
        raise RowError(f"field {answer_key!r} must be a string, got {type(gold).__name__}")
    return gold


def _math_verdict(answer: str | None, row: dict[str, Any], answer_key: str) -> Verdict:
    gold = _gold(row, answer_key)
    if answer is None:
        return Verdict(0.0)
    try:
        return Verdict(1.0 if answers_match(answer, gold) else 0.0)
    except GoldAnswerError as error:
        raise RowError(f"field {answer_key!r}: {error}") from error


def boxed_accuracy(completion: str, row: dict[str, Any], answer_key: str = "gt_answer") -> Verdict:
    """1.0 when the last ``\\boxed{}`` of the completion equals the gold answer; no box -> 0.0."""
    return _math_verdict(last_boxed_content(completion), row, answer_key)


def tag_accuracy(completion: str, row: dict[str, Any], answer_key: str = "gt_answer") -> Verdict:
    """1.0 when the last ``<answer>`` tag equals the gold answer (a ``\\boxed{}`` inside the tag is unwrapped)."""
    answer = last_answer_tag(completion)
    if answer is not None and ("\\boxed" in answer or "\\fbox" in answer):
        answer = last_boxed_content(answer)
    return _math_verdict(answer, row, answer_key)


def read_test_cases(row: dict[str, Any], key: str = "test_cases") -> tuple[list[str], list[str]]:
    """The (inputs, outputs) of a code row, checked: equal-length lists of strings. Raises RowError."""
    cases = row.get(key)
    if not isinstance(cases, dict):
        raise RowError(f"field {key!r} must be a dict with 'inputs' and 'outputs', got {type(cases).__name__}")
    lists = []
    for name in ("inputs", "outputs"):
        values = cases.get(name)
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise RowError(f"field {key}.{name} must be a list of strings")
        lists.append(list(values))
    inputs, outputs = lists
    if len(inputs) != len(outputs):
        raise RowError(f"field {key}: {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise RowError(f"field {key} has no test cases")
    return inputs, outputs


def code_accuracy(completion: str, row: dict[str, Any], sandbox: Any) -> Verdict:
    """1.0 when the last python block passes every test case in ``sandbox`` (a checked ``grpo_core.infra.sandbox.Sandbox``);
    0.0 with the sandbox's reason otherwise. ``SandboxUnavailable`` propagates: code never runs outside a sandbox.
    """
    from grpo_core.infra.sandbox import check_tests  # the sandbox is only needed for code rewards

    inputs, outputs = read_test_cases(row)
    program = last_python_block(completion)
    if program is None:
        return Verdict(0.0, "no ```python block in the completion")
    outcome = check_tests(program, inputs, outputs, sandbox=sandbox)
    if outcome.passed:
        return Verdict(1.0)
    reason = outcome.reason or "wrong output"
    return Verdict(0.0, f"{outcome.n_passed}/{outcome.n_total} tests passed; {reason}")
