"""Reading prompt datasets (jsonl, parquet, a Hugging Face ``save_to_disk`` folder; local or fsspec URL) into
normalised rows, checking every row.

Why check here: a malformed row found in the middle of training costs a run; found at load time it costs a
message naming the file, the row and the field. Rows are numbered by where they are in the file: jsonl errors name
the 1-based *line*, parquet and HF datasets the 0-based *row index*. With ``on_bad_row="skip"`` a bad row is left out
and listed in ``PromptSet.skipped`` as ``(row, reason)`` with the same numbering; nothing is dropped silently. A
row's length in tokens needs the policy's tokenizer: ``grpo_core.data.precheck`` checks it when a run starts, with the
same rules (``PromptSet.refs`` says where each kept row is in its file).

Normalised row: every original column, plus
    prompt_id   int, the 0-based position of the row in the file (stable across skips)
    messages    list of {"role", "content"} turns (a single turn dict, a list of turns, or a plain string from
                ``prompt_key`` used as the user turn)
    gt_answer   str (math format; numbers are turned into strings), from ``answer_key``
    test_cases  {"inputs": [str], "outputs": [str]} of equal length (code format; a JSON string is decoded)

The chat format (SFT's conversations) has no answer: its ``messages`` must hold at least one assistant turn (what
is trained on), and may hold tool turns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

FORMATS = ("math", "code", "chat")
ON_BAD_ROW = ("error", "skip")
ROLES = ("system", "user", "assistant")
CHAT_ROLES = ROLES + ("tool",)


class DataError(ValueError):
    """A dataset cannot be read; the message names the file, the row (line or index, saying which) and the field."""


class _RowProblem(ValueError):
    """A problem with one row's field; turned into a DataError with the file and row by the caller."""


@dataclass(frozen=True, slots=True)
class RowRef:
    """Where a row is in its file: ``number`` as the skipped rows list it (jsonl: the 1-based line; parquet and HF
    datasets: the 0-based index), ``label`` as errors name it ("line 3", "row 2 (0-based)")."""

    file: str
    number: int
    label: str


@dataclass
class PromptSet:
    rows: list[dict]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    source: str = ""
    # where each of ``rows`` is in its file (same order); empty for a set built in memory
    refs: list[RowRef] = field(default_factory=list)

    def ref(self, index: int) -> RowRef:
        """Where ``rows[index]`` is in its file (a set built in memory: its prompt id in ``source``)."""
        if self.refs:
            return self.refs[index]
        prompt_id = self.rows[index]["prompt_id"]
        return RowRef(self.source, int(prompt_id), f"row {prompt_id}")


def read_prompts(path: str, *, format: str = "math", prompt_key: str = "messages", answer_key: str = "gt_answer",
                 on_bad_row: str = "error", storage_options: dict | None = None) -> PromptSet:
    """Read and check a prompt dataset. Raises DataError (or skips, with ``on_bad_row="skip"``) on bad rows."""
    if format not in FORMATS:
        raise ValueError(f"unknown data format {format!r}; choose one of {FORMATS}")
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row must be one of {ON_BAD_ROW}, got {on_bad_row!r}")
    result = PromptSet(rows=[], skipped=[], source=path)
    for position, (row_label, row_number, record) in enumerate(iter_records(path, storage_options)):
        try:
            if isinstance(record, _RowProblem):
                raise record
            result.rows.append(normalise_row(record, position, format, prompt_key, answer_key))
            result.refs.append(RowRef(path, row_number, row_label))
        except _RowProblem as problem:
            if on_bad_row == "skip":
                result.skipped.append((row_number, str(problem)))
                continue
            raise DataError(f"{path}: {row_label}: {problem}") from None
    if not result.rows:
        detail = f" ({len(result.skipped)} bad rows skipped)" if result.skipped else ""
        raise DataError(f"{path}: no usable rows{detail}")
    return result


def iter_records(path: str, storage_options: dict | None = None) -> Iterator[tuple[str, int, Any]]:
    """Yield ``(row label, row number, record)``; a line that is not a JSON object yields a _RowProblem record."""
    import fsspec

    filesystem, local_path = fsspec.core.url_to_fs(path, **(storage_options or {}))
    if not filesystem.exists(local_path):
        raise DataError(f"{path}: no such file or folder")
    if filesystem.isdir(local_path):
        yield from _hf_records(path, storage_options)
    elif local_path.endswith((".jsonl", ".json")):
        yield from _jsonl_records(path, filesystem, local_path)
    elif local_path.endswith(".parquet"):
        yield from _parquet_records(path, filesystem, local_path)
    else:
        raise DataError(f"{path}: unknown dataset type; expected .jsonl, .parquet or a save_to_disk folder")


def _jsonl_records(path: str, filesystem: Any, local_path: str) -> Iterator[tuple[str, int, Any]]:
    """Lines are decoded one at a time: a line that is not UTF-8 or not JSON is one bad row (skippable), not an
    unreadable file."""
    with filesystem.open(local_path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            label = f"line {line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                yield label, line_number, _RowProblem(f"not valid UTF-8 (byte {error.start + 1} of the line)")
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                yield label, line_number, _RowProblem(f"not valid JSON ({error.msg} at column {error.colno})")
                continue
            if not isinstance(record, dict):
                yield label, line_number, _RowProblem(f"expected a JSON object, got {type(record).__name__}")
                continue
            yield label, line_number, record


def _parquet_records(path: str, filesystem: Any, local_path: str) -> Iterator[tuple[str, int, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(local_path, filesystem=filesystem)
    except Exception as error:  # pyarrow raises several types for a corrupt file; all mean "cannot read"
        raise DataError(f"{path}: cannot read as parquet: {error}") from error
    for index, record in enumerate(table.to_pylist()):
        yield f"row {index} (0-based)", index, record


def _hf_records(path: str, storage_options: dict | None) -> Iterator[tuple[str, int, Any]]:
    import datasets

    try:
        dataset = datasets.load_from_disk(path, storage_options=storage_options)
    except FileNotFoundError as error:
        raise DataError(f"{path}: not a dataset saved with save_to_disk: {error}") from error
    if isinstance(dataset, datasets.DatasetDict):
        raise DataError(f"{path}: holds a DatasetDict with splits {list(dataset)}; give the folder of one split")
    for index, record in enumerate(dataset):
        yield f"row {index} (0-based)", index, record


def normalise_row(record: dict[str, Any], position: int, format: str, prompt_key: str,
                  answer_key: str) -> dict[str, Any]:
    """One checked, normalised row (see the module docstring). Raises _RowProblem naming the field."""
    row = dict(record)
    row["prompt_id"] = position
    row["messages"] = _messages(record, prompt_key, CHAT_ROLES if format == "chat" else ROLES)
    if format == "math":
        row["gt_answer"] = _gt_answer(record, answer_key)
    elif format == "chat":
        if not any(turn["role"] == "assistant" for turn in row["messages"]):
            raise _RowProblem(f"field {prompt_key!r} has no assistant turn: a conversation to fine-tune on needs "
                              f"at least one")
    else:
        row["test_cases"] = _test_cases(record)
    return row


def _messages(record: dict[str, Any], prompt_key: str, roles: tuple[str, ...] = ROLES) -> list[dict[str, str]]:
    if prompt_key not in record or record[prompt_key] is None:
        raise _RowProblem(f"field {prompt_key!r} is missing")
    value = record[prompt_key]
    if isinstance(value, str):
        if not value.strip():
            raise _RowProblem(f"field {prompt_key!r} is an empty string")
        return [{"role": "user", "content": value}]
    turns = [value] if isinstance(value, dict) else value
    if not isinstance(turns, list) or not turns:
        raise _RowProblem(f"field {prompt_key!r} must be a string, a {{role, content}} object or a non-empty list "
                          f"of them, got {type(value).__name__}")
    checked = []
    for index, turn in enumerate(turns):
        where = f"field {prompt_key!r}" + (f"[{index}]" if isinstance(value, list) else "")
        if not isinstance(turn, dict):
            raise _RowProblem(f"{where} must be an object with 'role' and 'content', got {type(turn).__name__}")
        role, content = turn.get("role"), turn.get("content")
        if role not in roles:
            raise _RowProblem(f"{where}.role must be one of {roles}, got {role!r}")
        if not isinstance(content, str):
            raise _RowProblem(f"{where}.content must be a string, got {type(content).__name__}")
        checked.append({"role": role, "content": content})
    if all(turn["role"] == "system" for turn in checked):
        raise _RowProblem(f"field {prompt_key!r} has only system turns; a prompt needs a user turn")
    return checked


def _gt_answer(record: dict[str, Any], answer_key: str) -> str:
    if answer_key not in record or record[answer_key] is None:
        raise _RowProblem(f"field {answer_key!r} is missing")
    value = record[answer_key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _RowProblem(f"field {answer_key!r} must be a string or a number, got {type(value).__name__}")
    answer = str(value)
    if not answer.strip():
        raise _RowProblem(f"field {answer_key!r} is empty")
    return answer


def _test_cases(record: dict[str, Any]) -> dict[str, list[str]]:
    if record.get("test_cases") is None:
        raise _RowProblem("field 'test_cases' is missing")
    value = record["test_cases"]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise _RowProblem(f"field 'test_cases' is a string but not valid JSON ({error.msg})") from None
    if not isinstance(value, dict):
        raise _RowProblem(f"field 'test_cases' must be an object with 'inputs' and 'outputs', "
                          f"got {type(value).__name__}")
    lists = {}
    for name in ("inputs", "outputs"):
        values = value.get(name)
        if not isinstance(values, list):
            raise _RowProblem(f"field 'test_cases.{name}' must be a list of strings, got {type(values).__name__}")
        for index, item in enumerate(values):
            if not isinstance(item, str):
                raise _RowProblem(f"field 'test_cases.{name}[{index}]' must be a string, got {type(item).__name__}")
        lists[name] = values
    if len(lists["inputs"]) != len(lists["outputs"]):
        raise _RowProblem(f"field 'test_cases': {len(lists['inputs'])} inputs but {len(lists['outputs'])} outputs")
    if not lists["inputs"]:
        raise _RowProblem("field 'test_cases' has no test cases")
    return {"inputs": lists["inputs"], "outputs": lists["outputs"]}
