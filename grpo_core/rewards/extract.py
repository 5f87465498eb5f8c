"""Pulling the final answer out of a completion: the last ``\\boxed{}``, the last ``<answer>`` tag, the last python block.

Why "last": a model that reasons step by step often writes intermediate results in the same form as its answer
(a boxed partial result, a draft answer tag, a draft program); the convention of the common math and code graders is
that the final one counts. Each function returns ``None`` when there is nothing to extract, never an empty guess.
"""
from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# ```python / ```py / ```Python3 ... ``` ; the closing fence must start a line (or follow the code directly).
_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def _braced_group(text: str, open_index: int) -> str | None:
    """Content of the ``{...}`` group whose ``{`` is at ``open_index``, nested braces balanced; None if unclosed."""
    depth = 0
    index = open_index
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text) and text[index + 1] in "{}":
            index += 2  # an escaped brace \{ or \} is content, not structure
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1:index]
        index += 1
    return None


def _last_command_start(text: str) -> tuple[int, str] | None:
    """Position and name of the last ``\\boxed`` or ``\\fbox`` that is a whole command (not ``\\boxedx``)."""
    best: tuple[int, str] | None = None
    for command in _BOX_COMMANDS:
        start = text.rfind(command)
        while start != -1:
            after = start + len(command)
            if after >= len(text) or not text[after].isalpha():
                break
            start = text.rfind(command, 0, start)
        if start != -1 and (best is None or start > best[0]):
            best = (start, command)
    return best


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept) or ``\\boxed 5`` form.

    Returns None when there is no box, the box is never closed, or it is empty.
    """
    found = _last_command_start(text)
    if found is None:
        return None
    start, command = found
    after = start + len(command)
    rest = text[after:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        content = _braced_group(text, after + (len(rest) - len(stripped)))
    elif rest[:1].isspace() and stripped:
        # "\\boxed 5": the answer runs to the next whitespace or math delimiter.
        content = re.split(r"[\s$]", stripped, maxsplit=1)[0]
    else:
        content = None  # a bare "\\boxed" at the end (a truncated completion)
    if content is None or not content.strip():
        return None  # the last box is empty, unclosed or truncated: no answer, even if an earlier box had one
    return content.strip()


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` pair, stripped; None when absent or empty."""
    matches = _ANSWER_TAG.findall(text)
    if not matches:
        return None
    content = matches[-1].strip()
    return content or None


def last_python_block(text: str) -> str | None:
    """Code of the last fenced python block (```python or ```py); None when there is none or it is blank."""
    matches = _PYTHON_BLOCK.findall(text)
    if not matches:
        return None
    code = matches[-1]
    return code if code.strip() else None
