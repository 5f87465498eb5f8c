"""Checkpoint layout, commit, discovery and pruning on a local folder and on a real S3 server."""
from __future__ import annotations

import uuid

import pytest

from grpo_core.run import checkpoint
from grpo_core.run.checkpoint import CheckpointWriter, Snapshot
from grpo_core.run.status import RunStatus, list_runs, summarize
from grpo_core.run.storage import RunStore, StorageError


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return RunStore(str(tmp_path / "runs"), "run1")
    s3 = request.getfixturevalue("s3_server")
    return RunStore(f"s3://{s3['bucket']}/ckpt-{uuid.uuid4().hex[:8]}", "run1", s3["storage_options"])


def _write(store: RunStore, iteration: int, size: int = 100) -> dict:
    snap = Snapshot()
    snap.add_bytes("model.safetensors", b"w" * size)
    snap.add_bytes("learner/optim.pt", b"o" * (2 * size))
    snap.add_json(checkpoint.STATE, {"iteration": iteration})
    return CheckpointWriter(store, checkpoint.checkpoint_path(iteration), snap).start().result(wait=True)


def test_a_checkpoint_counts_only_once_committed(store):
    assert checkpoint.latest(store) is None
    written = _write(store, 1)
    assert written.files["learner/optim.pt"]["bytes"] == 200
    assert checkpoint.latest(store) is None  # files without a manifest are no checkpoint
    ref = checkpoint.commit(store, 1, policy_version=2, files=written.files, keep_last=2)
    assert (ref.iteration, ref.policy_version, ref.next_iteration, ref.name) == (1, 2, 2, "iter-000001")
    assert checkpoint.latest(store) == ref
    assert store.get_json_file(checkpoint.LATEST)["checkpoint"] == "checkpoints/iter-000001"


def test_commit_refuses_missing_files(store):
    written = _write(store, 3)
    store.delete("checkpoints/iter-000003/learner/optim.pt")
    with pytest.raises(StorageError, match="optim.pt"):
        checkpoint.commit(store, 3, 4, written.files, keep_last=2)
    assert checkpoint.latest(store) is None


def test_latest_skips_a_damaged_checkpoint_and_prune_keeps_the_newest(store):
    refs = [checkpoint.commit(store, it, it + 1, _write(store, it).files, keep_last=0) for it in (1, 3, 5)]
    assert [r.iteration for r in checkpoint.complete_checkpoints(store)] == [1, 3, 5]
    # A write in progress (newer, no manifest) is neither chosen nor pruned.
    _write(store, 7)
    store.put_bytes("checkpoints/iter-000005/model.safetensors", b"cut")  # damaged after its commit
    assert checkpoint.latest(store) == refs[1]  # latest.json names iter-5, which no longer checks out
    removed = checkpoint.prune(store, keep_last=1, newest=refs[1])
    assert removed == ["checkpoints/iter-000001"]
    assert store.list_dirs("checkpoints") == ["iter-000003", "iter-000005", "iter-000007"]


def test_keep_last_prunes_after_each_commit(store):
    for it in range(0, 8, 2):
        checkpoint.commit(store, it, it, _write(store, it).files, keep_last=2)
    assert [r.iteration for r in checkpoint.complete_checkpoints(store)] == [4, 6]


def test_download_gives_a_local_folder(store, tmp_path):
    ref = checkpoint.commit(store, 2, 3, _write(store, 2).files, keep_last=2)
    folder = checkpoint.download(store, ref, str(tmp_path / "dl"))
    assert checkpoint.read_state(folder) == {"iteration": 2}


def test_run_summaries_for_grpo_runs(tmp_path):
    root = str(tmp_path / "runs")
    done = RunStore(root, "done")
    done.write_config({"iterations": 4})
    for it in range(4):
        done.append_metrics({"iteration": it, "reward_mean": 0.1 * it, "eval_accuracy": 0.5 if it == 2 else None})
    checkpoint.commit(done, 3, 4, _write(done, 3).files, keep_last=2)
    RunStatus(state="finished", iterations=4, iteration=3).write(done)
    dead = RunStore(root, "dead")
    dead.write_config({"iterations": 10})
    dead.append_metrics({"iteration": 0, "reward_mean": 0.0})
    RunStatus(state="running", iterations=10, iteration=0, pid=2**22 + 12345).write(dead)  # no such process
    RunStore(root, "empty").put_bytes("notes.txt", b"not a run")

    summaries = {s.name: s for s in list_runs(root)}
    assert set(summaries) == {"done", "dead"}
    assert (summaries["done"].status, summaries["done"].iteration, summaries["done"].eval_accuracy,
            summaries["done"].latest_checkpoint) == ("finished", 3, 0.5, "iter-000003")
    assert summaries["dead"].status == "interrupted" and summaries["dead"].latest_checkpoint is None
    assert summarize(done).policy_version == 4


def test_grpo_runs_list_and_show(tmp_path, capsys):
    from grpo_cli.commands import main

    root = str(tmp_path / "runs")
    run = RunStore(root, "alpha")
    run.write_config({"iterations": 2})
    run.append_metrics({"iteration": 0, "reward_mean": 0.25, "eval_accuracy": 0.125})
    checkpoint.commit(run, 0, 1, _write(run, 0).files, keep_last=2)
    RunStatus(state="failed", iterations=2, iteration=0, error="RunFailed: policy actor died").write(run)
    assert main(["runs", "list", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "failed" in out and "iter-000000" in out and "0.125" in out
    assert main(["runs", "show", "alpha", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "policy actor died" in out and "iter-000000 (policy version 1)" in out
    assert main(["runs", "show", "nope", "--root", root]) == 2


def test_a_run_is_named_or_given_as_its_folder_path(tmp_path, capsys, monkeypatch):
    """`grpo export --merge runs/NAME OUT`, `grpo runs show runs/NAME`: a run folder's path names its own root."""
    from grpo_cli.commands import main
    from grpo_core.run.status import locate_run

    root = tmp_path / "runs"
    run = RunStore(str(root), "alpha")
    run.write_config({"iterations": 2, "model": {"path": "m"}})
    monkeypatch.chdir(tmp_path)
    assert locate_run("alpha", "runs") == ("runs", "alpha")
    assert locate_run("runs/alpha/", "elsewhere") == ("runs", "alpha")
    assert locate_run(str(root / "alpha"), "runs") == (str(root), "alpha")
    with pytest.raises(ValueError, match=r"not a run folder \(no config.json in runs/beta\)"):
        locate_run("runs/beta", "runs")
    assert main(["runs", "show", "runs/alpha"]) == 0
    assert "alpha" in capsys.readouterr().out
    # a path is accepted; the export then says why this run has nothing to merge (no final policy), no traceback
    assert main(["export", "--merge", "runs/alpha", str(tmp_path / "out")]) == 2
    assert "no complete final policy" in capsys.readouterr().err
    assert main(["export", "--merge", "runs/beta", str(tmp_path / "out")]) == 2
    assert "runs/beta: not a run folder (no config.json in runs/beta); a run is named under its root: beta --root " \
        "runs" in capsys.readouterr().err
