"""`grpo data convert`: common datasets saved with HF `datasets` (``save_to_disk`` folder, parquet or jsonl) into the
math and code formats that `grpo train` reads (grpo_core/data/readers.py).

Presets name the columns of well-known sets and how their answers are written; ``--prompt-key``, ``--answer-key``
and ``--tests-key`` map other names (a dotted key reaches into a nested column, e.g. ``reward_model.ground_truth``):

    gsm8k  question / answer: the gold answer is the number after the last ``#### `` (thousands commas dropped)
    math   problem / solution: the content of the last ``\\boxed{}`` (a value without a box is taken as it is, e.g.
           MATH-500's ``answer`` column)
    code   prompt / test_cases (prime-style): a chat or a string, and tests as ``{"inputs": [...], "outputs":
           [...]}``, a list of ``{"input", "output"}`` pairs, or either one as a JSON string

Every converted row is checked by the reader the training uses, so a converted file always loads. A row that
cannot be converted is an error naming the file, the row and the field, or with ``on_bad_row="skip"`` is left out,
counted and listed (``Converted.skipped``); nothing is dropped silently.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from grpo_core.data.readers import DataError, _RowProblem, iter_records, normalise_row
from grpo_core.rewards.extract import last_boxed_content


@dataclass(frozen=True)
class Preset:
    format: str            # "math" or "code"
    prompt_key: str
    answer_key: str | None  # math
    tests_key: str | None   # code
    answer: str            # how the gold answer is found in the answer column: "gsm8k", "boxed"


PRESETS: dict[str, Preset] = {
    "gsm8k": Preset("math", "question", "answer", None, "gsm8k"),
    "math": Preset("math", "problem", "solution", None, "boxed"),
    "code": Preset("code", "prompt", None, "test_cases", ""),
}


@dataclass
class Converted:
    rows: list[dict[str, Any]]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (row label, reason)
    source: str = ""


def resolve_source(path: str, split: str | None) -> str:
    """The file or folder to read: a ``save_to_disk`` DatasetDict folder needs ``split`` (its sub-folder)."""
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as handle:
            splits = json.load(handle).get("splits", [])
        if split is None:
            raise DataError(f"{path}: holds a DatasetDict with splits {splits}; choose one with --split")
        if split not in splits:
            raise DataError(f"{path}: no split {split!r}; it has {splits}")
        return os.path.join(path, split)
    if split is not None:
        raise DataError(f"{path}: --split {split} given, but this is not a DatasetDict folder (one split only)")
    return path


def convert(path: str, preset: str, *, prompt_key: str | None = None, answer_key: str | None = None,
            tests_key: str | None = None, keep: tuple[str, ...] = (), split: str | None = None,
            on_bad_row: str = "error") -> Converted:
    """Rows of ``path`` in the preset's format (keys overridden by the arguments); see the module docstring."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    p = PRESETS[preset]
    prompt_key, answer_key, tests_key = prompt_key or p.prompt_key, answer_key or p.answer_key, tests_key or p.tests_key
    source = resolve_source(path, split)
    out = Converted(rows=[], source=source)
    for label, _, record in iter_records(source):
        try:
            if isinstance(record, _RowProblem):
                raise record
            row = {"messages": _prompt(record, prompt_key)}
            if p.format == "math":
                row["gt_answer"] = _answer(record, answer_key, p.answer)
            else:
                row["test_cases"] = _tests(record, tests_key)
            for key in keep:
                row[key.replace(".", "_")] = _get(record, key)
            normalise_row(row, len(out.rows), p.format, "messages", "gt_answer")  # what `grpo train` checks
        except _RowProblem as problem:
            if on_bad_row == "skip":
                out.skipped.append((label, str(problem)))
                continue
            raise DataError(f"{source}: {label}: {problem}") from None
        out.rows.append(row)
    if not out.rows:
        raise DataError(f"{source}: no row could be converted" + (f" ({len(out.skipped)} skipped; first: "
                                                                    f"{out.skipped[0][0]}: {out.skipped[0][1]})"
                                                                    if out.skipped else ""))
    return out


def write_rows(rows: list[dict[str, Any]], out: str) -> None:
    """jsonl (or parquet, by the extension), written to a temporary name then renamed."""
    if not out.endswith((".jsonl", ".parquet")):
        raise DataError(f"{out}: the output must end in .jsonl or .parquet")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.partial-{os.getpid()}-{time.monotonic_ns()}"
    if out.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, out)


def _get(record: dict[str, Any], key: str) -> Any:
    """``record[key]``; a dotted key reaches into nested objects. Raises _RowProblem naming the field."""
    value: Any = record
    for depth, part in enumerate(key.split(".")):
        if isinstance(value, str) and depth:  # a nested column stored as JSON text
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _RowProblem(f"field {key!r}: {'.'.join(key.split('.')[:depth])!r} is text, not an "
                                  "object") from None
        if not isinstance(value, dict) or value.get(part) is None:
            columns = sorted(record) if depth == 0 else sorted(value) if isinstance(value, dict) else []
            raise _RowProblem(f"field {key!r} is missing (has: {columns})")
        value = value[part]
    return value


def _prompt(record: dict[str, Any], key: str) -> Any:
    value = _get(record, key)
    if isinstance(value, str):
        if not value.strip():
            raise _RowProblem(f"field {key!r} is an empty string")
        return {"role": "user", "content": value}
    return value  # a chat (list of turns) or one turn: checked by the reader


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def _answer(record: dict[str, Any], key: str, how: str) -> str:
    value = _get(record, key)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowProblem(f"field {key!r} must be a string or a number, got {type(value).__name__}")
    text = str(value)
    if how == "gsm8k":
        m = _GSM8K_ANSWER.search(text)
        if m is None:
            raise _RowProblem(f"field {key!r} has no '#### <answer>' line (GSM8K's final answer)")
        answer = m.group(1).replace(",", "").strip()
    elif "\\boxed" in text or "\\fbox" in text:
        answer = (last_boxed_content(text) or "").strip()
    else:
        answer = text.strip()
    if not answer:
        raise _RowProblem(f"field {key!r}: the final answer is empty")
    return answer


def _tests(record: dict[str, Any], key: str) -> dict[str, list[str]]:
    value = _get(record, key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise _RowProblem(f"field {key!r} is a string but not valid JSON ({error.msg})") from None
    if isinstance(value, list):  # [{"input": ..., "output": ...}, ...]
        pairs = value
        if not all(isinstance(c, dict) and "input" in c and "output" in c for c in pairs):
            raise _RowProblem(f"field {key!r}: a list of tests must hold {{'input', 'output'}} objects")
        value = {"inputs": [c["input"] for c in pairs], "outputs": [c["output"] for c in pairs]}
    if not isinstance(value, dict):
        raise _RowProblem(f"field {key!r} must hold inputs and outputs, got {type(value).__name__}")
    inputs, outputs = value.get("inputs"), value.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise _RowProblem(f"field {key!r} must have list 'inputs' and 'outputs' (has: {sorted(value)})")
    return {"inputs": [_text(v, key, "inputs", i) for i, v in enumerate(inputs)],
            "outputs": [_text(v, key, "outputs", i) for i, v in enumerate(outputs)]}


def _text(value: Any, key: str, name: str, index: int) -> str:
    """A test's stdin or stdout as text: numbers become their text, a list of lines is joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value) + "\n"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value}\n"
    raise _RowProblem(f"field '{key}.{name}[{index}]' must be text, got {type(value).__name__}")
