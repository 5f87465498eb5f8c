"""`grpo data convert`: GSM8K, MATH and a prime-style code set, built here as small HF datasets (save_to_disk,
parquet, jsonl; nothing downloaded), into formats that `grpo train`'s reader loads; bad rows name file, row, field."""
from __future__ import annotations

import json

import datasets
import pytest

from grpo_cli.commands import main
from grpo_core.data.convert import convert
from grpo_core.data.readers import DataError, read_prompts

GSM8K = {"question": ["Tom has 3 apples and buys 4. How many?", "A farm has 1,200 hens and 34 more. How many?"],
         "answer": ["3 + 4 = <<3+4=7>>7\n#### 7", "1200 + 34 = 1234\n#### 1,234"]}
MATH = {"problem": ["What is $\\frac{1}{2} + \\frac{1}{4}$?", "Solve $x^2 = 4$, $x > 0$."],
        "solution": ["We add: $\\boxed{\\frac{3}{4}}$.", "So $x = \\boxed{2}$ (not $\\boxed{-2}$... final: "
                     "$\\boxed{2}$)."],
        "level": ["Level 1", "Level 2"]}
PRIME = {"prompt": [[{"role": "user", "content": "Print the sum of two integers."}],
                    [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Echo the line."}]],
         "reward_model": [{"ground_truth": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
                          {"ground_truth": json.dumps([{"input": "hi\n", "output": "hi\n"},
                                                       {"input": "x\n", "output": "x\n"}])}]}


def test_gsm8k_dataset_dict_folder_by_split(tmp_path, capsys):
    folder = tmp_path / "gsm8k"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(GSM8K),
                          "test": datasets.Dataset.from_dict(GSM8K)}).save_to_disk(str(folder))
    out = tmp_path / "gsm8k.jsonl"
    assert main(["data", "convert", str(folder), "--preset", "gsm8k", "--split", "train", "--out", str(out)]) == 0
    assert "converted 2 rows" in capsys.readouterr().out
    rows = read_prompts(str(out)).rows  # what `grpo train` reads
    assert [r["gt_answer"] for r in rows] == ["7", "1234"]
    assert rows[0]["messages"] == [{"role": "user", "content": GSM8K["question"][0]}]
    assert main(["data", "convert", str(folder), "--preset", "gsm8k", "--out", str(out)]) == 2
    assert "DatasetDict with splits ['train', 'test']; choose one with --split" in capsys.readouterr().err


def test_math_parquet_takes_the_last_box_and_keeps_columns(tmp_path):
    source = tmp_path / "math.parquet"
    datasets.Dataset.from_dict(MATH).to_parquet(str(source))
    result = convert(str(source), "math", keep=("level",))
    assert [r["gt_answer"] for r in result.rows] == ["\\frac{3}{4}", "2"]
    assert result.rows[1]["level"] == "Level 2"
    # MATH-500 style: an `answer` column without a box is taken as it is
    answers = datasets.Dataset.from_dict({"problem": ["1+1?"], "answer": ["2"]})
    answers.to_json(str(tmp_path / "m500.jsonl"))
    assert convert(str(tmp_path / "m500.jsonl"), "math", answer_key="answer").rows[0]["gt_answer"] == "2"


def test_prime_style_code_set_with_nested_json_tests(tmp_path):
    folder = tmp_path / "prime"
    datasets.Dataset.from_list([{"prompt": p, "reward_model": r}
                                for p, r in zip(PRIME["prompt"], PRIME["reward_model"])]).save_to_disk(str(folder))
    out = tmp_path / "code.jsonl"
    assert main(["data", "convert", str(folder), "--preset", "code", "--tests-key", "reward_model.ground_truth",
                 "--out", str(out)]) == 0
    rows = read_prompts(str(out), format="code").rows
    assert rows[0]["test_cases"] == {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    assert rows[1]["test_cases"] == {"inputs": ["hi\n", "x\n"], "outputs": ["hi\n", "x\n"]}
    assert rows[1]["messages"][0] == {"role": "system", "content": "Be exact."}


def test_bad_rows_name_file_row_and_field_or_are_skipped_and_listed(tmp_path, capsys):
    rows = {"question": ["ok?", "no final answer?", "", "fine?"],
            "answer": ["#### 1", "the answer is 5", "#### 3", "#### 4"]}
    folder = tmp_path / "bad"
    datasets.Dataset.from_dict(rows).save_to_disk(str(folder))
    with pytest.raises(DataError, match=r"bad: row 1 \(0-based\): field 'answer' has no '#### <answer>' line"):
        convert(str(folder), "gsm8k")
    with pytest.raises(DataError, match=r"row 0 \(0-based\): field 'query' is missing \(has: \['answer', "
                                        r"'question'\]\)"):
        convert(str(folder), "gsm8k", prompt_key="query")
    out = tmp_path / "kept.jsonl"
    assert main(["data", "convert", str(folder), "--preset", "gsm8k", "--on-bad-row", "skip", "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    assert "converted 2 rows" in printed and "skipped 2 bad rows" in printed
    assert "row 1 (0-based): field 'answer' has no" in printed and "row 2 (0-based): field 'question' is an empty" \
        in printed
    assert [r["gt_answer"] for r in read_prompts(str(out)).rows] == ["1", "4"]
    code = datasets.Dataset.from_dict({"prompt": ["p"], "test_cases": ['{"inputs": ["1"], "outputs": 3}']})
    code.to_parquet(str(tmp_path / "code.parquet"))
    with pytest.raises(DataError, match=r"code.parquet: row 0 \(0-based\): field 'test_cases' must have list "
                                        r"'inputs' and 'outputs'"):
        convert(str(tmp_path / "code.parquet"), "code")
