"""model.init_from: which run's policy a new run starts from, resolved once and recorded (scheduled retraining)."""
from __future__ import annotations

import json
import os

import pytest

from grpo_core.run import checkpoint

from grpo_core.lifecycle import lineage
from grpo_core.run.status import FINAL_MANIFEST, STATUS
from grpo_core.run.storage import CONFIG, RunStore


def _run(root: str, name: str, *, updated_at: float, final: bool = False, checkpoint_iter: int | None = None,
         adapter: bool = False, options: dict | None = None) -> RunStore:
    store = RunStore(root, name, options)
    store.put_json_file(CONFIG, {"run_name": name})
    store.put_json_file(STATUS, {"state": "finished" if final else "running", "updated_at": updated_at})
    model_file = "adapter_config.json" if adapter else "config.json"
    if final:
        store.put_bytes(f"final/{model_file}", b"{}")
        store.put_bytes("final/model.safetensors", b"weights")
        store.put_json_file(FINAL_MANIFEST, {"files": {}, "policy_version": 40})
    if checkpoint_iter is not None:
        path = checkpoint.checkpoint_path(checkpoint_iter)
        store.put_bytes(f"{path}/{model_file}", b"{}")
        store.put_bytes(f"{path}/learner/optim.pt", b"optimizer")
        files = {model_file: {"bytes": 2}, "learner/optim.pt": {"bytes": 9}}
        checkpoint.commit(store, checkpoint_iter, checkpoint_iter + 1, files, keep_last=0)
    return store


def test_picks_the_newest_run_with_a_policy_and_never_itself(tmp_path):
    root = str(tmp_path)
    _run(root, "nightly-20261120", updated_at=100.0, final=True)
    _run(root, "nightly-20261121", updated_at=200.0, checkpoint_iter=9)   # crashed after a checkpoint
    _run(root, "nightly-20261122", updated_at=300.0)                      # started, no policy yet
    _run(root, "other", updated_at=900.0, final=True)                     # does not match the glob
    src = lineage.resolve("nightly-*", root, None, this_run="nightly-20261123")
    assert (src.run, src.folder, src.policy_version) == ("nightly-20261121", "checkpoints/iter-000009", 10)
    _run(root, "nightly-20261123", updated_at=999.0, final=True)          # the run itself never counts
    assert lineage.resolve("nightly-*", root, None, this_run="nightly-20261123").run == "nightly-20261121"
    assert lineage.resolve("nightly-20261120", root, None, this_run="x").folder == "final"


def test_nothing_matching_means_model_path(tmp_path):
    src = lineage.resolve("nightly-*", str(tmp_path), None, this_run="nightly-1")
    assert src.folder is None and src.spec == "nightly-*"
    assert lineage.local_policy_folder(src, str(tmp_path), None, str(tmp_path / "cache")) is None
    assert "matched no run" in lineage.describe(src)
    assert lineage.resolve(None, str(tmp_path), None, this_run="x").folder is None


def test_resolved_once_per_run_and_recorded(tmp_path):
    root = str(tmp_path)
    _run(root, "nightly-1", updated_at=100.0, final=True)
    me = RunStore(root, "nightly-2")
    first, before = lineage.recorded_or_resolved(me, "nightly-*", root, None)
    assert not before and first.run == "nightly-1"
    assert json.loads((tmp_path / "nightly-2" / lineage.INIT_FROM).read_text())["run"] == "nightly-1"
    _run(root, "nightly-1b", updated_at=500.0, final=True)  # finished while nightly-2 was down
    again, before = lineage.recorded_or_resolved(me, "nightly-*", root, None)
    assert before and again == first  # a resume starts from the same weights


def test_local_folder_and_a_copy_from_a_remote_store(tmp_path, s3_server):
    root = str(tmp_path)
    _run(root, "a", updated_at=1.0, final=True)
    src = lineage.resolve("a", root, None, this_run="b")
    assert lineage.local_policy_folder(src, root, None, str(tmp_path / "cache")) == str(tmp_path / "a" / "final")
    s3_root, options = f"s3://{s3_server['bucket']}/lineage", s3_server["storage_options"]
    _run(s3_root, "a", updated_at=1.0, checkpoint_iter=3, options=options)
    remote = lineage.resolve("a", s3_root, options, this_run="b")
    folder = lineage.local_policy_folder(remote, s3_root, options, str(tmp_path / "cache"))
    assert sorted(os.listdir(folder)) == ["config.json"]  # the policy, not the learner state


def test_an_adapter_is_refused_with_what_to_do(tmp_path):
    root = str(tmp_path)
    _run(root, "lora-run", updated_at=1.0, final=True, adapter=True)
    src = lineage.resolve("lora-run", root, None, this_run="b")
    with pytest.raises(lineage.InitFromError, match="LoRA adapter.*grpo export --merge"):
        lineage.local_policy_folder(src, root, None, str(tmp_path / "cache"))


def test_an_hf_folder_is_used_as_it_is(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    src = lineage.resolve(str(tmp_path / "model"), str(tmp_path / "runs"), None, this_run="b")
    assert lineage.local_policy_folder(src, str(tmp_path / "runs"), None, "unused") == str(tmp_path / "model")


def test_the_distillation_teacher_is_resolved_like_init_from_into_teacher_json(tmp_path):
    from grpo_core.config import build_config
    from tasks.run_state import resolve_inputs

    root = str(tmp_path)
    (tmp_path / "data.jsonl").write_text('{"messages": [{"role": "user", "content": "q"}], "gt_answer": "1"}\n')

    def inputs(teacher: str, run: str):
        cfg = build_config({"run_name": run, "model": {"path": "m"},
                            "data": {"train_path": str(tmp_path / "data.jsonl")}, "distill": {"teacher": teacher},
                            "storage": {"root": root}})
        return resolve_inputs.fn(cfg, RunStore(root, run))

    with pytest.raises(lineage.InitFromError, match=r"distill.teacher='teacher-\*' is neither a model folder"):
        inputs("teacher-*", "student-1")
    assert not (tmp_path / "student-1" / lineage.TEACHER).exists()  # no choice recorded: a resume looks again
    _run(root, "teacher-1", updated_at=100.0, final=True)
    got = inputs("teacher-*", "student-1")
    assert got.teacher_folder == str(tmp_path / "teacher-1" / "final") and "run teacher-1's final" in got.teacher_from
    assert json.loads((tmp_path / "student-1" / lineage.TEACHER).read_text())["run"] == "teacher-1"
    _run(root, "teacher-2", updated_at=200.0, final=True)  # newer, but the run keeps its recorded teacher
    assert inputs("teacher-*", "student-1").teacher_folder == str(tmp_path / "teacher-1" / "final")
    assert inputs("teacher-*", "student-2").teacher_folder == str(tmp_path / "teacher-2" / "final")
    assert inputs(str(tmp_path / "teacher-1" / "final"), "student-3").teacher_folder == \
        str(tmp_path / "teacher-1" / "final")  # a model folder (with config.json) as it is
    assert json.loads((tmp_path / "student-1" / lineage.INIT_FROM).read_text())["spec"] is None
