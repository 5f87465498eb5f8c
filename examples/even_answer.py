"""A reward plugin that measures what the built-in reward model prefers: 1.0 for an even boxed answer, 0.0 for an
odd one, None (does not apply) without a boxed integer. ``configs/tiny-rm.yaml`` gives it weight 0: it only records
``reward_even_answer_mean``, the property the reward model moves."""
from __future__ import annotations

import re

_BOXED_INT = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def even_answer(completions: list[str], **columns) -> list[float | None]:
    out: list[float | None] = []
    for text in completions:
        found = _BOXED_INT.findall(text)
        out.append(None if not found else float(int(found[-1]) % 2 == 0))
    return out
