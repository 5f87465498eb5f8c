"""RunStore on a local folder and on a real S3 server: commits, manifests, resume safety."""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pyarrow as pa
import pytest

from grpo_core.run import storage
from grpo_core.run.storage import (
    ConfigConflict,
    ManifestEntry,
    MetricsSchemaError,
    RunStore,
    StageIncomplete,
)


@pytest.fixture(params=["local", "s3"])
def make_store(request, tmp_path):
    """A factory of RunStores on one root: a tmp folder, or a fresh prefix in the S3 test bucket."""
    if request.param == "local":
        root, options = str(tmp_path / "runs"), None
    else:
        s3 = request.getfixturevalue("s3_server")
        root, options = f"s3://{s3['bucket']}/runs-{uuid.uuid4().hex[:8]}", s3["storage_options"]

    def make(run_name: str = "run1", fresh_client: bool = False) -> RunStore:
        opts = dict(options or {})
        if fresh_client and options is not None:
            opts["skip_instance_cache"] = True  # another process after a restart: no shared caches
        return RunStore(root, run_name, opts or None)

    make.kind = request.param
    return make


def _table(n: int = 5) -> pa.Table:
    return pa.table({"prompt_id": list(range(n)), "text": [f"answer {i}" for i in range(n)], "reward": [i / n for i in range(n)]})


def _raw(store: RunStore, rel: str) -> bytes:
    return store.fs.cat_file(store.uri.removeprefix("s3://") + "/" + rel) if store.uri.startswith("s3://") else open(
        os.path.join(store.uri, rel), "rb"
    ).read()


def test_uri_and_iteration_dir(make_store):
    store = make_store("my-run")
    if make_store.kind == "local":
        assert os.path.isabs(store.uri) and store.uri.endswith("/runs/my-run")
    else:
        assert store.uri.startswith("s3://grpo-test/runs-") and store.uri.endswith("/my-run")
    assert store.iteration_dir(42) == store.uri + "/iter-000042"
    with pytest.raises(ValueError):
        store.iteration_dir(-1)


def test_table_and_json_round_trip_with_manifest(make_store):
    store = make_store()
    table = _table()
    entry = store.put_table(3, "rollouts.parquet", table, meta={"policy_version": 2})
    assert isinstance(entry, ManifestEntry)
    assert entry.name == "rollouts.parquet" and entry.rows == 5 and entry.meta == {"policy_version": 2}
    assert store.get_table(3, "rollouts.parquet").equals(table)

    doc = {"loss": 0.25, "kl": 0.01, "nested": {"lr": 1e-6}}
    jentry = store.put_json(3, "train.json", doc)
    assert jentry.rows is None
    assert store.get_json(3, "train.json") == doc

    manifest = json.loads(_raw(store, "iter-000003/MANIFEST.json"))
    assert set(manifest["files"]) == {"rollouts.parquet", "train.json"}
    assert "updated" in manifest
    data = _raw(store, "iter-000003/rollouts.parquet")
    rec = manifest["files"]["rollouts.parquet"]
    assert rec == {"rows": 5, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "meta": {"policy_version": 2}}

    # Names without a suffix get the natural one, and resolve either way.
    store.put_table(3, "scored", table)
    assert store.entry(3, "scored").name == "scored.parquet"
    assert store.get_table(3, "scored").num_rows == 5
    assert store.entry(3, "scored.parquet") == store.entry(3, "scored")

    # A fresh client (as after a restart) sees the same complete iteration.
    again = make_store(fresh_client=True)
    assert again.list_complete_iterations() == [3]
    assert again.entry(3, "train.json") == jentry


def test_unlisted_file_is_incomplete(make_store):
    """The data file exists but the manifest does not list it: not complete."""
    store = make_store()
    store.put_table(0, "rollouts.parquet", _table())
    store.put_bytes("iter-000000/scored.parquet", _raw(store, "iter-000000/rollouts.parquet"))
    store.put_bytes("iter-000001/rollouts.parquet", _raw(store, "iter-000000/rollouts.parquet"))
    assert store.exists("iter-000000/scored.parquet")
    assert store.entry(0, "scored.parquet") is None
    with pytest.raises(StageIncomplete, match=r"iter-000000/scored\.parquet"):
        store.get_table(0, "scored.parquet")
    with pytest.raises(StageIncomplete, match=r"iter-000001/rollouts\.parquet"):
        store.get_table(1, "rollouts.parquet")
    with pytest.raises(FileNotFoundError):  # StageIncomplete is a FileNotFoundError
        store.get_json(0, "train.json")
    assert store.list_complete_iterations() == [0]
    assert store.list_complete_iterations(required=["rollouts.parquet", "scored.parquet"]) == []


def test_listed_but_damaged_file_is_incomplete(make_store):
    store = make_store()
    store.put_table(0, "rollouts.parquet", _table())
    good = _raw(store, "iter-000000/rollouts.parquet")
    # Same size, different content: entry() (size check) passes, get_table (checksum) refuses.
    store.put_bytes("iter-000000/rollouts.parquet", bytes(reversed(good)))
    assert store.entry(0, "rollouts.parquet") is not None
    with pytest.raises(StageIncomplete, match="differs from the manifest"):
        store.get_table(0, "rollouts.parquet")
    # Truncated: entry() is None and the iteration no longer counts as complete.
    store.put_bytes("iter-000000/rollouts.parquet", good[:-10])
    assert store.entry(0, "rollouts.parquet") is None
    assert store.list_complete_iterations() == []


def test_failed_table_write_keeps_previous_manifest(make_store, monkeypatch):
    store = make_store()
    store.put_table(1, "rollouts.parquet", _table())
    before = _raw(store, "iter-000001/MANIFEST.json")

    def broken_write(table, sink, *args, **kwargs):
        sink.write(b"PAR1 half a file")
        raise OSError("disk on fire")

    monkeypatch.setattr(storage.manifest.pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk on fire"):
        store.put_table(1, "scored.parquet", _table())
    monkeypatch.undo()

    assert _raw(store, "iter-000001/MANIFEST.json") == before
    assert store.entry(1, "scored.parquet") is None
    assert not store.exists("iter-000001/scored.parquet")
    assert store.get_table(1, "rollouts.parquet").num_rows == 5
    if make_store.kind == "local":  # no temp files left behind
        assert sorted(os.listdir(store.iteration_dir(1))) == ["MANIFEST.json", "rollouts.parquet"]


def test_crash_between_data_and_manifest_leaves_file_unlisted(make_store, monkeypatch):
    """The data is written, then the manifest write fails: the old manifest stands."""
    store = make_store()
    store.put_table(2, "rollouts.parquet", _table())
    before = _raw(store, "iter-000002/MANIFEST.json")
    real_write = store._write_atomic

    def write_then_die(path, data):
        if path.endswith("MANIFEST.json"):
            raise ConnectionError("lost the object store")
        real_write(path, data)

    monkeypatch.setattr(store, "_write_atomic", write_then_die)
    with pytest.raises(ConnectionError):
        store.put_json(2, "train.json", {"loss": 1.0})
    monkeypatch.undo()

    assert store.exists("iter-000002/train.json")
    assert _raw(store, "iter-000002/MANIFEST.json") == before
    assert store.entry(2, "train.json") is None
    with pytest.raises(StageIncomplete, match="train.json"):
        store.get_json(2, "train.json")


def test_bad_inputs_write_nothing(make_store):
    store = make_store()
    with pytest.raises(ValueError, match="not JSON-serializable"):
        store.put_json(0, "train.json", {"x": object()})
    with pytest.raises(ValueError, match="meta for"):
        store.put_table(0, "rollouts.parquet", _table(), meta={"bad": {1, 2}})
    with pytest.raises(ValueError):
        store.put_table(0, "MANIFEST.json", _table())
    with pytest.raises(ValueError):
        store.put_bytes("../escape.txt", b"x")
    assert store.list_complete_iterations() == []
    assert not store.exists("iter-000000/rollouts.parquet")


def test_metrics_append_replace_and_new_columns(make_store):
    store = make_store()
    assert store.read_metrics().num_rows == 0
    store.append_metrics({"iteration": 1, "reward_mean": 0.5, "eval_accuracy": None, "time_rollout_s": 2})
    store.append_metrics({"iteration": 0, "reward_mean": 0.25, "eval_accuracy": 0.1, "time_rollout_s": 3})
    store.append_metrics({"iteration": 2, "reward_mean": 0.75, "eval_accuracy": None, "time_rollout_s": 1.5, "kl": 0.01})
    store.append_metrics({"iteration": 1, "reward_mean": 0.6, "eval_accuracy": 0.3, "time_rollout_s": 2})  # replaces

    table = make_store(fresh_client=True).read_metrics()
    assert table["iteration"].to_pylist() == [0, 1, 2]
    assert table["reward_mean"].to_pylist() == [0.25, 0.6, 0.75]
    assert table["eval_accuracy"].to_pylist() == [0.1, 0.3, None]
    assert table["kl"].to_pylist() == [None, None, 0.01]
    assert table["time_rollout_s"].to_pylist() == [3.0, 2.0, 1.5]
    assert table.schema.field("iteration").type == pa.int64()
    assert table.schema.field("time_rollout_s").type == pa.float64()  # int widened once a float came
    assert table.schema.field("eval_accuracy").type == pa.float64()

    with pytest.raises(MetricsSchemaError, match="reward_mean"):
        store.append_metrics({"iteration": 3, "reward_mean": "high"})
    with pytest.raises(ValueError, match="iteration"):
        store.append_metrics({"reward_mean": 1.0})
    assert store.read_metrics().num_rows == 3  # failed appends changed nothing


def test_write_config_once(make_store):
    store = make_store()
    assert store.read_config() is None
    config = {"model": {"name": "tiny", "lr": 1e-5}, "seed": 1, "group_size": 8}
    store.write_config(config)
    store.write_config(dict(config))  # resume with the same config: fine
    assert store.read_config() == config
    changed = {"model": {"name": "tiny", "lr": 2e-5}, "seed": 1, "group_size": 8, "extra": True}
    with pytest.raises(ConfigConflict, match=r"config\.json.*extra: \(absent\) -> true; model\.lr: 1e-05 -> 2e-05"
                       ) as info:
        store.write_config(changed)
    assert "seed" not in str(info.value).split("differ:")[1]
    assert store.read_config() == config
    # Fields the caller allows to change (a whole section or one dotted key) are written and reported.
    longer = {"model": {"name": "tiny", "lr": 1e-5}, "seed": 1, "group_size": 16}
    assert store.write_config(longer, may_change=["group_size"]) == ["group_size: 8 -> 16"]
    assert store.read_config() == longer
    with pytest.raises(ConfigConflict, match="model.lr"):
        store.write_config(changed, may_change=["group_size", "extra"])


def test_run_level_files_and_folders(make_store):
    store = make_store()
    assert store.get_json_file("latest.json") is None
    store.put_json_file("latest.json", {"iteration": 3})
    assert store.get_json_file("latest.json") == {"iteration": 3}
    store.put_bytes("checkpoints/iter-000001/a.bin", b"x" * 10)
    store.put_bytes("checkpoints/iter-000001/learner/b.pt", b"y" * 3)
    store.put_bytes("checkpoints/iter-000003/a.bin", b"z")
    assert store.list_dirs("checkpoints") == ["iter-000001", "iter-000003"]
    assert store.list_files("checkpoints/iter-000001") == {"a.bin": 10, "learner/b.pt": 3}
    assert store.list_files("checkpoints/iter-000099") == {}
    store.delete("checkpoints/iter-000001")
    assert store.list_dirs("checkpoints") == ["iter-000003"]
    store.delete("checkpoints/iter-000001")  # absent: nothing to do


def test_put_bytes_and_exists(make_store):
    store = make_store()
    assert not store.exists("report/curves.png")
    store.put_bytes("report/curves.png", b"\x89PNG fake")
    assert store.exists("report/curves.png")
    assert store.get_bytes("report/curves.png") == b"\x89PNG fake"


def test_list_complete_iterations_ignores_other_folders(make_store):
    store = make_store()
    for it in (5, 0, 12):
        store.put_json(it, "train.json", {"it": it})
    store.put_bytes("iter-000007/rollouts.parquet", b"orphan")  # no manifest
    store.put_bytes("checkpoints/step-000005/MANIFEST.json", b"{}")
    store.write_config({"a": 1})
    assert store.list_complete_iterations() == [0, 5, 12]
    assert store.list_complete_iterations(required=["train"]) == [0, 5, 12]
    assert make_store("other-run").list_complete_iterations() == []


def test_s3_credentials_are_enforced(s3_server):
    bad = dict(s3_server["storage_options"], secret="wrong-secret", skip_instance_cache=True)
    store = RunStore(f"s3://{s3_server['bucket']}/denied", "run", bad)
    with pytest.raises((PermissionError, OSError)):
        store.put_json(0, "train.json", {"x": 1})


def test_local_overwrite_interrupted_mid_write_keeps_old_file(tmp_path, monkeypatch):
    """On disk a file is replaced by rename: a write that dies before the rename changes nothing."""
    store = RunStore(str(tmp_path), "run")
    store.put_bytes("report/summary.txt", b"old summary")

    def dying_fsync(fd):
        raise OSError("power cut")

    monkeypatch.setattr(storage.files.os, "fsync", dying_fsync)
    with pytest.raises(OSError, match="power cut"):
        store.put_bytes("report/summary.txt", b"new summary that never lands")
    monkeypatch.undo()
    assert store.get_bytes("report/summary.txt") == b"old summary"
    assert os.listdir(tmp_path / "run" / "report") == ["summary.txt"]


def test_s3_server_start_failure_shows_log_tail(tmp_path):
    from grpo_core.infra.s3server import S3ServerError, start_s3_server

    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'fatal: cannot open volume dir' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(S3ServerError, match=r"(?s)exited with code 3.*weed\.log.*cannot open volume dir"):
        start_s3_server(tmp_path / "srv", weed=str(fake), timeout=10)


def test_s3_server_binds_loopback_only(s3_server):
    import socket
    from urllib.parse import urlparse

    url = urlparse(s3_server["endpoint_url"])
    assert url.hostname == "127.0.0.1"
    with socket.create_connection((url.hostname, url.port), timeout=2):
        pass
    assert s3_server["start_seconds"] < 15


def test_metrics_written_elsewhere_are_read_again(make_store):
    """A store keeps the metrics it wrote last (the flow appends every iteration); a file another writer replaced
    since, even with a same-sized table, is read again, never served from that copy."""
    store, other = make_store(), make_store(fresh_client=True)
    store.append_metrics({"iteration": 0, "loss": 1.0})
    assert store.read_metrics()["loss"].to_pylist() == [1.0]
    other.append_metrics({"iteration": 0, "loss": 2.0})  # replaces the row: same schema, same size
    assert store.read_metrics()["loss"].to_pylist() == [2.0]
    store.append_metrics({"iteration": 1, "loss": 3.0})
    assert other.read_metrics()["loss"].to_pylist() == [2.0, 3.0]
    assert store.read_metrics()["loss"].to_pylist() == [2.0, 3.0]


def test_truncate_metrics_drops_rows_from_an_iteration_on(make_store):
    store = make_store()
    for it in range(5):
        store.append_metrics({"iteration": it, "loss": float(it)})
    assert store.truncate_metrics(3) == 2
    assert store.read_metrics()["iteration"].to_pylist() == [0, 1, 2]
    assert store.truncate_metrics(3) == 0
