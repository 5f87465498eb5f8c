"""The built-in tiny models ship as files (models/): each folder is exactly what its BUILD.json records (every file's
sha256, the command and seed that made it), so every machine trains the same bytes; a folder edited by hand or half
replaced is caught here. That a build from the recipe still reaches its task's bar is test_tiny_model's e2e check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_core.lifecycle.model import build_record

MODELS = Path(__file__).resolve().parents[1] / "models"
SHIPPED = ("tiny", "tiny-code", "tiny-tools", "tiny-rm", "tiny-base")


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_model_is_what_its_build_record_says(name):
    folder = MODELS / name
    record = build_record.read(folder)
    assert build_record.check(folder) == []
    assert record.command.startswith(f"grpo model {name} ") and f"--seed {record.seed}" in record.command
    assert {"config.json", "model.safetensors", "tokenizer.json", "build_metrics.json"} <= record.files.keys()
    assert record.code["commit"] and not record.code["dirty"], "shipped models are built from a committed checkout"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2"


def test_the_record_check_names_a_changed_a_missing_and_an_added_file(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    (folder / "b.bin").write_bytes(b"\0" * 8)
    build_record.write(folder, ["model", "tiny", "--out", str(folder), "--seed", "0"], seed=0)
    assert build_record.check(folder) == []
    (folder / "a.json").write_text('{"x": 1}')
    (folder / "b.bin").unlink()
    (folder / "c.txt").write_text("new")
    problems = build_record.check(folder)
    assert problems[0] == "b.bin: missing" and problems[1] == "c.txt: not in BUILD.json"
    assert problems[2].startswith("a.json: sha256 ") and len(problems) == 3
    (folder / "BUILD.json").write_text("[]")
    with pytest.raises(ValueError, match=r"m/BUILD.json: not a build record"):
        build_record.check(folder)
