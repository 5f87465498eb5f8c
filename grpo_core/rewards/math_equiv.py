"""Mathematical equivalence of an extracted answer and a gold answer, with math-verify.

Why a wrapper: math-verify's own timeouts use ``signal.alarm`` and its parser silently returns ``[]`` on trouble. Here
its timeouts are switched off (the scorer's worker process enforces one budget per row, see ``worker.py``), and an
unparseable *gold* answer is an error (the row cannot be scored), while an unparseable *prediction* is just wrong.

Both sides are parsed as the content of a ``\\boxed{}``: that makes plain gold answers (``7``, ``1/2``, ``0.5``),
LaTeX ones (``\\frac{1}{2}``, ``\\{1,2\\}``, ``x^2+1``) and boxed ones (``\\boxed{7}``) all parse the same way.
"""
from __future__ import annotations

import functools
from typing import Any

from grpo_core.rewards.extract import last_boxed_content

GOLD_CACHE_SIZE = 4096
MATCH_CACHE_SIZE = 65536


class GoldAnswerError(ValueError):
    """The gold answer cannot be parsed into something to compare against: the row cannot be scored."""


def _parse_boxed(content: str, fallback_mode: str = "first_match") -> list[Any]:
    from math_verify import parse  # imported lazily: the scorer's parent process never needs sympy

    return parse("\\boxed{" + content + "}", parsing_timeout=None, fallback_mode=fallback_mode)


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def parse_gold(gold: str) -> tuple[Any, ...]:
    """Parsed gold answer (cached: the G samples of a prompt share one gold). Raises GoldAnswerError."""
    if not isinstance(gold, str):
        raise GoldAnswerError(f"gold answer must be a string, got {type(gold).__name__}")
    content = last_boxed_content(gold) if ("\\boxed" in gold or "\\fbox" in gold) else gold.strip()
    if not content:
        raise GoldAnswerError(f"gold answer {gold!r} is empty")
    parsed = _parse_boxed(content, fallback_mode="no_fallback")  # a gold that sympy cannot read is unusable
    if not parsed:
        raise GoldAnswerError(f"gold answer {gold!r} could not be parsed by math-verify")
    return tuple(parsed)


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def answers_match(predicted: str, gold: str) -> bool:
    """Whether the extracted answer ``predicted`` (box content, tag content) equals ``gold`` mathematically.

    Cached: a pure function of two strings, and the samples of a prompt mostly box the same few answers in different
    completions (reward.dedupe only merges identical completions). Raises GoldAnswerError for an unusable gold
    answer (never cached). No timeout of its own: call it under the worker's alarm.
    """
    from math_verify import verify

    gold_parsed = list(parse_gold(gold))
    predicted_parsed = _parse_boxed(predicted)
    if not predicted_parsed:
        return False
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=None))
