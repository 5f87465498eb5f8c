"""`grpo score` through run_score: every row and column kept in order, reward columns added, bad rows handled."""
from __future__ import annotations

import argparse
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_core.rewards.score_file import add_score_arguments, run_score

pytestmark = pytest.mark.timeout(120)

ROWS = [
    {"id": "a", "gt_answer": "7", "response": "<think>3+4</think> <answer>\\boxed{7}</answer>"},
    {"id": "b", "gt_answer": "1/2", "response": "<think>half</think><answer>0.5</answer>"},
    {"id": "c", "gt_answer": "3", "response": "no tags, \\boxed{3}"},
    {"id": "d", "gt_answer": "\\frac{", "response": "<think></think><answer>1</answer>"},
]


def parse(argv):
    parser = argparse.ArgumentParser(prog="grpo score")
    add_score_arguments(parser)
    return parser.parse_args(argv)


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_jsonl_in_jsonl_out_with_two_rewards(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "out.jsonl"
    code = run_score(parse([str(source), "-o", str(out), "--reward-type", "think_answer_tags",
                            "--rewards", "accuracy,format", "--reward-weights", "1,0.5", "--workers", "1"]))
    assert code == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]
    assert all(r["response"] == s["response"] and r["gt_answer"] == s["gt_answer"] for r, s in zip(rows, ROWS))
    assert [r["reward_accuracy"] for r in rows] == [1.0, 1.0, 0.0, None]
    assert [r["reward_format"] for r in rows] == [1.0, 1.0, 0.0, 1.0]
    assert [r["reward"] for r in rows] == [1.5, 1.5, 0.0, None]
    assert rows[3]["reward_error"] and "gt_answer" in rows[3]["reward_error"]
    assert rows[0]["reward_error"] is None
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "4 rows" in summary and "mean reward 1.0000 over 3 scored" in summary and "1 unscored" in summary


def test_parquet_keeps_columns_and_bad_rows_keep_their_place(tmp_path, capsys):
    rows = [dict(ROWS[0], extra=1), dict(ROWS[2], response=None, extra=2), dict(ROWS[0], id="e", extra=3)]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    out = tmp_path / "out.parquet"
    assert run_score(parse([str(source), "-o", str(out), "--workers", "1"])) == 2
    assert "row 1" in capsys.readouterr().err and not out.exists()

    assert run_score(parse([str(source), "-o", str(out), "--workers", "1", "--on-bad-row", "skip"])) == 0
    table = pq.read_table(out)
    assert table.column_names == ["id", "gt_answer", "response", "extra", "reward", "reward_accuracy", "reward_error"]
    assert table.column("extra").to_pylist() == [1, 2, 3]
    assert table.column("reward").to_pylist() == [1.0, None, 1.0]
    assert "'response' is missing" in table.column("reward_error").to_pylist()[1]


def test_line_that_is_not_json_is_skipped_counted_and_listed(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n{not json\n\n" + json.dumps(ROWS[2]) + "\n")
    out = tmp_path / "out.jsonl"
    assert run_score(parse([str(source), "-o", str(out), "--workers", "1"])) == 2
    assert "line 2: not valid JSON" in capsys.readouterr().err and not out.exists()

    assert run_score(parse([str(source), "-o", str(out), "--workers", "1", "--on-bad-row", "skip"])) == 0
    printed = capsys.readouterr()
    assert "1 unreadable line(s) left out" in printed.out and "skipped line 2: not valid JSON" in printed.err
    rows = read_jsonl(out)
    assert [(r["id"], r["reward"]) for r in rows] == [("a", 1.0), ("c", 1.0)]  # the line has no row: left out
    listed = json.loads((tmp_path / "out.jsonl.skipped.json").read_text())
    assert [line.split(":")[0] for line in listed[str(source)]] == ["line 2"]
    source.write_text(json.dumps(ROWS[0]) + "\n")
    assert run_score(parse([str(source), "-o", str(out), "--workers", "1", "--on-bad-row", "skip"])) == 0
    assert not (tmp_path / "out.jsonl.skipped.json").exists()  # a clean input leaves no stale list behind


def test_bad_configuration_is_reported_not_raised(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n")
    assert run_score(parse([str(source), "-o", str(tmp_path / "o.jsonl"), "--rewards", "accuracy,nonsense"])) == 2
    assert "unknown reward 'nonsense'" in capsys.readouterr().err
    assert run_score(parse([str(source), "-o", str(tmp_path / "o.csv")])) == 2
    assert run_score(parse([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")])) == 2
