"""Readers: jsonl, parquet and save_to_disk folders normalise to the same rows; malformed rows name file/row/field."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_core.data.prompts import DEFAULT_SYSTEM_PROMPTS, chat_messages
from grpo_core.data.readers import DataError, read_prompts

MATH_ROWS = [
    {"messages": {"role": "user", "content": "What is 2 + 3?"}, "gt_answer": "5", "level": 1},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Half of 1?"}],
     "gt_answer": "\\frac{1}{2}", "level": 2},
]
CODE_ROW = {"messages": "Echo the input.", "test_cases": {"inputs": ["a\n", "b\n"], "outputs": ["a\n", "b\n"]}}


def write_jsonl(path, records, raw_lines=()):
    lines = [json.dumps(r) for r in records] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_math_rows_are_normalised(tmp_path):
    prompts = read_prompts(write_jsonl(tmp_path / "m.jsonl", MATH_ROWS))
    assert prompts.skipped == [] and prompts.source.endswith("m.jsonl")
    first, second = prompts.rows
    assert first["prompt_id"] == 0 and second["prompt_id"] == 1
    assert first["messages"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert second["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["gt_answer"] == "5" and second["gt_answer"] == "\\frac{1}{2}"
    assert first["level"] == 1  # other columns are kept


def test_parquet_and_hf_folder_read_like_jsonl(tmp_path):
    import datasets
    records = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 1 + 1?", "answer": "2"}]
    parquet = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    folder = tmp_path / "hf"
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    for path in (str(parquet), str(folder), f"file://{parquet}"):
        prompts = read_prompts(path, prompt_key="question", answer_key="answer")
        assert [r["messages"] for r in prompts.rows] == [[{"role": "user", "content": r["question"]}] for r in records]
        assert [r["gt_answer"] for r in prompts.rows] == ["5", "2"]
        assert [r["prompt_id"] for r in prompts.rows] == [0, 1]


def test_code_rows_and_json_encoded_test_cases(tmp_path):
    encoded = dict(CODE_ROW, test_cases=json.dumps(CODE_ROW["test_cases"]))
    prompts = read_prompts(write_jsonl(tmp_path / "c.jsonl", [CODE_ROW, encoded]), format="code")
    assert [r["test_cases"] for r in prompts.rows] == [CODE_ROW["test_cases"]] * 2
    assert prompts.rows[0]["messages"] == [{"role": "user", "content": "Echo the input."}]


@pytest.mark.parametrize("bad, field", [
    ({"gt_answer": "5"}, "'messages' is missing"),
    ({"messages": {"role": "user", "content": 5}, "gt_answer": "5"}, "'messages'.content must be a string"),
    ({"messages": [{"role": "robot", "content": "x"}], "gt_answer": "5"}, "'messages'[0].role"),
    ({"messages": "hi"}, "'gt_answer' is missing"),
    ({"messages": "hi", "gt_answer": ["5"]}, "'gt_answer' must be a string or a number, got list"),
])
def test_malformed_math_row_names_file_line_and_field(tmp_path, bad, field):
    path = write_jsonl(tmp_path / "bad.jsonl", [MATH_ROWS[0], bad])
    with pytest.raises(DataError) as caught:
        read_prompts(path)
    message = str(caught.value)
    assert path in message and "line 2" in message and field in message


@pytest.mark.parametrize("cases, field", [
    ({"inputs": ["1"], "outputs": ["1", "2"]}, "1 inputs but 2 outputs"),
    ({"inputs": ["1"], "outputs": [1]}, "'test_cases.outputs[0]' must be a string"),
    ({"inputs": "1", "outputs": ["1"]}, "'test_cases.inputs' must be a list"),
    ("{not json", "'test_cases' is a string but not valid JSON"),
])
def test_malformed_code_rows_in_parquet_name_the_row_index(tmp_path, cases, field):
    path = tmp_path / "bad.parquet"
    good = json.dumps(CODE_ROW["test_cases"])
    bad = cases if isinstance(cases, str) else json.dumps(cases)
    pq.write_table(pa.Table.from_pylist([{"messages": "p", "test_cases": good}, {"messages": "q", "test_cases": bad}]),
                   path)
    with pytest.raises(DataError) as caught:
        read_prompts(str(path), format="code")
    assert str(path) in str(caught.value) and "row 1 (0-based)" in str(caught.value) and field in str(caught.value)


def test_bad_json_line_is_an_error_or_skipped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [MATH_ROWS[0]], raw_lines=['{"messages": "x", ', "[1, 2]",
                                                                            json.dumps(MATH_ROWS[1])])
    with pytest.raises(DataError, match=r"line 2: not valid JSON"):
        read_prompts(path)
    prompts = read_prompts(path, on_bad_row="skip")
    assert [r["prompt_id"] for r in prompts.rows] == [0, 3]
    assert [line for line, _ in prompts.skipped] == [2, 3]
    assert "expected a JSON object, got list" in prompts.skipped[1][1]


def test_line_that_is_not_utf8_is_one_bad_row(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(json.dumps(MATH_ROWS[0]).encode() + b"\n" + b'{"messages": "\xff\xfe"}\n'
                     + json.dumps(MATH_ROWS[1]).encode() + b"\n")
    with pytest.raises(DataError, match=r"bytes.jsonl: line 2: not valid UTF-8"):
        read_prompts(str(path))
    prompts = read_prompts(str(path), on_bad_row="skip")
    assert [r["prompt_id"] for r in prompts.rows] == [0, 2]
    assert prompts.skipped == [(2, "not valid UTF-8 (byte 15 of the line)")]


def test_nothing_usable_and_unknown_files_are_errors(tmp_path):
    path = write_jsonl(tmp_path / "allbad.jsonl", [{"messages": "x"}])
    with pytest.raises(DataError, match="no usable rows .1 bad rows skipped"):
        read_prompts(path, on_bad_row="skip")
    with pytest.raises(DataError, match="no such file"):
        read_prompts(str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown dataset type"):
        read_prompts(str(tmp_path / "data.csv"))


def test_chat_messages_system_prompt_rules():
    user = [{"role": "user", "content": "q"}]
    assert chat_messages(user, "boxed") == [{"role": "system", "content": DEFAULT_SYSTEM_PROMPTS["boxed"]}] + user
    assert chat_messages(user, "boxed", system_prompt="") == user
    assert chat_messages(user, "code", system_prompt="Custom.")[0] == {"role": "system", "content": "Custom."}
    with_system = [{"role": "system", "content": "Mine."}] + user
    assert chat_messages(with_system, "think_answer_tags") == with_system
    shots = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}]
    assert chat_messages(with_system, "boxed", few_shot=shots) == with_system[:1] + shots + user  # after system
    assert chat_messages(user, "boxed", system_prompt="", few_shot=shots) == shots + user
    assert "\\boxed{}" in DEFAULT_SYSTEM_PROMPTS["boxed"] and "<answer>" in DEFAULT_SYSTEM_PROMPTS["think_answer_tags"]
    assert "```python" in DEFAULT_SYSTEM_PROMPTS["code"]
    with pytest.raises(ValueError, match="no default system prompt"):
        chat_messages(user, "unknown")


def test_chat_rows_need_an_assistant_turn_and_may_hold_tool_turns(tmp_path):
    good = {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "<calc>2+3</calc>"},
                         {"role": "tool", "content": "5"}, {"role": "assistant", "content": "\\boxed{5}"}]}
    rows = read_prompts(write_jsonl(tmp_path / "chat.jsonl", [good]), format="chat").rows
    assert [t["role"] for t in rows[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
    no_answer = {"messages": [{"role": "user", "content": "2 + 3?"}]}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, no_answer])
    with pytest.raises(DataError, match=r"bad.jsonl: line 2: field 'messages' has no assistant turn"):
        read_prompts(path, format="chat")
    assert read_prompts(path, format="chat", on_bad_row="skip").skipped[0][0] == 2
    with pytest.raises(DataError, match=r"line 1: field 'messages'\[2\].role must be one of"):  # math: no tool turns
        read_prompts(write_jsonl(tmp_path / "m.jsonl", [{**good, "gt_answer": "5"}]))
