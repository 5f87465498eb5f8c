"""Judges' prompts and verdicts: what is asked, and how an answer becomes a score or a recorded reason.

A number verdict is the first number in the text, inside ``score_range``, mapped to [0, 1]. A yes/no verdict is
P(yes) / (P(yes) + P(no)) over the first generated token's top logprobs when the judge returns them (a graded score,
as in LLM-as-a-judge setups that read token probabilities), else 1 or 0 from the text. Anything else is
unparseable: the row is unscored with the judge's text kept, never a silent 0.
"""
from __future__ import annotations

import math
import re

from grpo_core.rewards.models.base import ModelVerdict, RewardInput

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_YES = ("yes", "true", "correct")
_NO = ("no", "false", "incorrect")


def judge_prompt(template: str, row: RewardInput, score_range: tuple[float, float]) -> str:
    """The judge's user message for one row (the template's fields are checked when the judge is built)."""
    low, high = score_range
    return template.format(question=row.question, response=row.response, answer=row.answer or "", low=low,
                           high=high)


def check_template(template: str) -> None:
    """A template with an unknown field fails here, when the judge is built, not on the first row."""
    try:
        judge_prompt(template, RewardInput((("user", "q"),), "r", "a"), (0.0, 1.0))
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(f"judge template: {error!r}; its fields are {{question}}, {{response}}, {{answer}}, "
                         "{low}, {high} (double other braces)") from None


def parse_number(text: str, score_range: tuple[float, float]) -> ModelVerdict:
    low, high = score_range
    found = _NUMBER.search(text)
    if found is None:
        return ModelVerdict(None, raw=text, error="judge: no number in the verdict")
    value = float(found.group())
    if not low <= value <= high:
        return ModelVerdict(None, raw=text, error=f"judge: verdict {value:g} outside score_range [{low:g}, {high:g}]")
    return ModelVerdict((value - low) / (high - low), raw=text)


def parse_yes_no(text: str, top_logprobs: dict[str, float] | None = None) -> ModelVerdict:
    """`top_logprobs`: the first generated token's alternatives (token text -> logprob), if the judge gave them."""
    if top_logprobs:
        yes = sum(math.exp(lp) for tok, lp in top_logprobs.items() if tok.strip().lower() in _YES)
        no = sum(math.exp(lp) for tok, lp in top_logprobs.items() if tok.strip().lower() in _NO)
        if yes + no > 0:
            return ModelVerdict(yes / (yes + no), raw=text)
    words = re.findall(r"[a-z]+", text.lower())
    first = words[0] if words else ""
    if first in _YES:
        return ModelVerdict(1.0, raw=text)
    if first in _NO:
        return ModelVerdict(0.0, raw=text)
    return ModelVerdict(None, raw=text, error="judge: the verdict is neither yes nor no")


def parse_verdict(kind: str, text: str, score_range: tuple[float, float],
                  top_logprobs: dict[str, float] | None = None) -> ModelVerdict:
    if kind == "number":
        return parse_number(text, score_range)
    return parse_yes_no(text, top_logprobs)
