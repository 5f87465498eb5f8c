"""The rollout inbox: complete items are checked, taken whole into an iteration, renumbered; bad, stale and
incomplete ones are refused or left, never dropped silently."""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_core.pipeline import inbox
from grpo_core.run.storage import RunStore

G = 4


def _item(groups: int, version: int = 3, **broken) -> pa.Table:
    rows = []
    for g in range(groups):
        for i in range(G):
            resp = [5, 6, 7][: 1 + (g + i) % 3]
            rows.append({"group_id": 100 + g, "sample_idx": i, "prompt_token_ids": [1, 2, 3],
                         "response_token_ids": resp, "sampler_logprobs": [-0.5] * len(resp),
                         "response_text": "x", "finish_reason": "stop", "truncated": False,
                         "response_length": len(resp), "policy_version": version,
                         "reward": float((g + i) % 2), "env": "maze"})
    for key, (row, value) in broken.items():
        rows[row][key] = value
    return pa.Table.from_pylist(rows)


def _put(store: RunStore, name: str, table: pa.Table, ready: bool = True) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put_bytes(f"inbox/{name}.parquet", buf.getvalue())
    if ready:
        store.put_bytes(f"inbox/{name}.ready", b"")


def _take(store: RunStore, batch_groups: int = 8, oldest: int = 2, newest: int = 4) -> inbox.Taken:
    return inbox.take(store, iteration=5, group_size=G, batch_groups=batch_groups, oldest_version=oldest,
                      newest_version=newest)


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(str(tmp_path), "run")


def test_complete_items_are_taken_whole_and_renumbered(store):
    _put(store, "a", _item(2))
    _put(store, "b", _item(1, version=4))
    _put(store, "c", _item(1), ready=False)  # still being written: not touched
    taken = _take(store)
    assert taken.items == ["a", "b"] and taken.groups == 3 and not taken.rejected
    t = taken.table
    assert t.column("group_id").to_pylist() == [g for g in (5, 6, 7) for _ in range(G)]  # the last 3 of 8 groups
    assert set(t.column("sampler_id").to_pylist()) == {-1} and set(t.column("iteration").to_pylist()) == {5}
    assert t.column("env").to_pylist()[0] == "maze"  # the producer's own columns are kept
    inbox.consume(store, taken.items)
    assert inbox.ready_items(store) == [] and "c.parquet" in store.list_files("inbox")


def test_items_that_do_not_fit_wait_and_one_group_is_always_ours(store):
    _put(store, "a", _item(3))
    _put(store, "b", _item(1))
    taken = _take(store, batch_groups=4)  # room for 3
    assert taken.items == ["a"] and taken.groups == 3
    inbox.consume(store, taken.items)
    assert inbox.ready_items(store) == ["b"]


@pytest.mark.parametrize("table,row,field,message", [
    (_item(1).drop_columns(["sampler_logprobs"]), None, "sampler_logprobs", "column is missing"),
    (_item(1, sampler_logprobs=(2, [-0.1, -0.2, -0.3, -0.4])), 2, "sampler_logprobs", "values for"),
    (_item(1, sample_idx=(3, 0)), 3, "sample_idx", "whole groups"),
    (_item(2).slice(0, 6), None, None, "do not form groups of 4"),
    (_item(1, reward=(1, float("nan"))), 1, "reward", "is nan"),
    (_item(1, version=1), 0, "policy_version", "outside the versions iteration 5 may train on"),
    (_item(1, version=9), 0, "policy_version", "outside"),
])
def test_bad_and_stale_items_are_refused_with_file_row_and_field_and_kept(store, table, row, field, message):
    _put(store, "bad", table)
    _put(store, "good", _item(1))
    taken = _take(store)
    assert taken.items == ["good"]
    [error] = taken.rejected
    assert error["file"].endswith("inbox/bad.parquet") and error["row"] == row and error["field"] == field
    assert message in error["error"]
    kept = store.list_files("inbox/rejected")
    assert set(kept) == {"bad.parquet", "bad.error.json"}
    assert store.get_json_file("inbox/rejected/bad.error.json") == error
    assert "bad.parquet" not in store.list_files("inbox")


def _episodes(groups: int, **broken) -> pa.Table:
    """An item of multi-turn episodes: response tokens 5, 6 from the policy, 9 from an environment."""
    table = _item(groups).drop_columns(["response_token_ids", "sampler_logprobs", "response_length"])
    n = table.num_rows
    masks = [[1, 0, 1] for _ in range(n)]
    for key, (row, value) in broken.items():
        assert key == "response_mask"
        masks[row] = value
    return (table.append_column("response_token_ids", pa.array([[5, 9, 6]] * n, pa.list_(pa.int32())))
            .append_column("sampler_logprobs", pa.array([[-0.5, 0.0, -0.5]] * n, pa.list_(pa.float32())))
            .append_column("response_length", pa.array([3] * n, pa.int32()))
            .append_column("response_mask", pa.array(masks, pa.list_(pa.int64()))))


def test_episodes_from_outside_keep_their_loss_masks(store):
    _put(store, "ep", _episodes(2))
    taken = _take(store)
    assert taken.items == ["ep"] and not taken.rejected
    assert taken.table.schema.field("response_mask").type == pa.list_(pa.int8())
    assert taken.table.column("response_mask").to_pylist() == [[1, 0, 1]] * 2 * G


@pytest.mark.parametrize("mask, message", [([1, 0], "has 2 values for 3 tokens"), ([0, 0, 0], "at least one 1"),
                                           ([1, 2, 1], "must be 0 (environment) or 1 (policy)")])
def test_a_bad_loss_mask_is_refused_with_its_row(store, mask, message):
    _put(store, "bad", _episodes(1, response_mask=(2, mask)))
    taken = _take(store)
    [error] = taken.rejected
    assert error["row"] == 2 and error["field"] == "response_mask" and message in error["error"]
