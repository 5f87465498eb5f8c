"""Data paths naming folders or globs: the files present at a run's first start, recorded and reused."""
from __future__ import annotations

import json

import pytest

from grpo_core.data.files import DATA_FILES, read_prompt_files, recorded_or_resolved, resolve_data_files
from grpo_core.data.readers import DataError
from grpo_core.run.storage import RunStore


def _jsonl(path, answers):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{a}"}], "gt_answer": str(a)})
                            + "\n" for a in answers))


def test_folder_glob_and_single_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _jsonl(data / "day-2.jsonl", [3])
    _jsonl(data / "day-1.jsonl", [1, 2])
    (data / "notes.txt").write_text("not data")
    (data / ".hidden.jsonl").write_text("")
    assert resolve_data_files(str(data)) == [str(data / "day-1.jsonl"), str(data / "day-2.jsonl")]
    assert resolve_data_files(str(data / "day-*.jsonl")) == [str(data / "day-1.jsonl"), str(data / "day-2.jsonl")]
    assert resolve_data_files(str(data / "day-1.jsonl")) == [str(data / "day-1.jsonl")]
    with pytest.raises(DataError, match="matches no data file"):
        resolve_data_files(str(data / "week-*.jsonl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no data file"):
        resolve_data_files(str(tmp_path / "empty"))


def test_a_save_to_disk_folder_is_one_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"messages": "q", "gt_answer": "1"}]).save_to_disk(str(tmp_path / "hf"))
    assert resolve_data_files(str(tmp_path / "hf")) == [str(tmp_path / "hf")]


def test_files_are_fixed_at_the_first_start(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _jsonl(data / "a.jsonl", [1])
    store = RunStore(str(tmp_path / "runs"), "nightly")
    first = recorded_or_resolved(store, {"train": str(data), "eval": None})
    assert first == {"train": [str(data / "a.jsonl")]}
    _jsonl(data / "b.jsonl", [2])  # new data arrives while the run is down
    assert recorded_or_resolved(store, {"train": str(data), "eval": None}) == first
    assert json.loads((tmp_path / "runs" / "nightly" / DATA_FILES).read_text())["files"] == first
    other = RunStore(str(tmp_path / "runs"), "next-night")  # the next run takes both
    assert len(recorded_or_resolved(other, {"train": str(data), "eval": None})["train"]) == 2


def test_prompt_ids_stay_unique_across_files(tmp_path):
    _jsonl(tmp_path / "a.jsonl", [1, 2])
    (tmp_path / "b.jsonl").write_text('{"messages": "q", "gt_answer": "9"}\n{"messages": "q"}\n'
                                      '{"messages": "q", "gt_answer": "7"}\n')
    sets = read_prompt_files([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], on_bad_row="skip")
    ids = [row["prompt_id"] for s in sets for row in s.rows]
    assert ids == [0, 1, 2, 4] and sets[1].skipped and sets[1].skipped[0][0] == 2
