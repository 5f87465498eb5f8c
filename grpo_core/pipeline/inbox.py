"""The rollout inbox: experience produced outside our samplers (an environment server, another cluster) that the
trainer takes in async RL, under the same staleness rule as its own rollouts.

A producer writes, into the run folder:

    inbox/<name>.parquet   whole groups of G rows, ordered by group then sample: the rollout columns
                           prompt_token_ids, response_token_ids, sampler_logprobs, response_text, finish_reason,
                           truncated, response_length, policy_version, group_id, sample_idx, plus `reward` (float,
                           null = could not be scored); other columns are kept. Multi-turn episodes add
                           `response_mask` (0/1 per response token: 0 = an environment's token, out of the loss)
    inbox/<name>.ready     written last: the item is complete (its content is not read)

Names must be unique within a run (a name taken by a recent iteration is treated as a leftover of a crash).

Before collecting iteration k's batch the flow takes complete items, oldest name first, as long as they fit in
the batch (at most prompts_per_iteration - 1 groups: at least one group is sampled by our samplers, unless the run
is an Atropos trainer, whose whole batch comes through the inbox) and are
fresh enough: every row's policy_version v must satisfy learner_version_before(k) - v <= s x optimizer steps per
iteration, and v can be no newer than the learner. The taken groups go into ``iter-k/inbox.parquet`` and replace
the same number of prompts of the iteration; the items are then deleted. A bad item (missing or mistyped column,
ragged group, bad value) and a stale one are moved to ``inbox/rejected/`` with ``<name>.error.json`` saying the
file, row and field: nothing is dropped silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from grpo_core.data.schemas import RESPONSE_MASK, ROLLOUT_SCHEMA
from grpo_core.run.storage import RunStore

INBOX = "inbox"
REJECTED = "inbox/rejected"
READY_SUFFIX = ".ready"
# Columns a producer fills; iteration, prompt_id and sampler_id are ours (sampler_id -1 marks outside rows).
PRODUCER_FIELDS = [f for f in ROLLOUT_SCHEMA if f.name not in ("iteration", "prompt_id", "sampler_id")]
OUTSIDE_SAMPLER = -1


class InboxError(ValueError):
    """A bad inbox item: ``file``, ``row`` (None: the whole file) and ``field`` say where."""

    def __init__(self, file: str, row: int | None, field_name: str | None, message: str):
        where = f"{file}" + (f", row {row}" if row is not None else "") + \
            (f", field {field_name!r}" if field_name else "")
        super().__init__(f"{where}: {message}")
        self.file, self.row, self.field, self.reason = file, row, field_name, message

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "row": self.row, "field": self.field, "error": self.reason}


def validate(table: pa.Table, url: str, group_size: int) -> pa.Table:
    """The item's rows with our columns typed as the rollout schema; raises InboxError at the first problem."""
    if table.num_rows == 0 or table.num_rows % group_size:
        raise InboxError(url, None, None, f"{table.num_rows} rows do not form groups of {group_size} "
                                          f"(rollout.samples_per_prompt)")
    columns = {}
    for f in PRODUCER_FIELDS + [pa.field("reward", pa.float64(), nullable=True)]:
        if f.name not in table.column_names:
            raise InboxError(url, None, f.name, "column is missing")
        col = table.column(f.name)
        try:
            col = col.cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InboxError(url, None, f.name, f"has type {col.type}, expected {f.type}: {exc}") from None
        if not f.nullable and col.null_count:
            row = pc.index(pc.is_null(col), True).as_py()
            raise InboxError(url, row, f.name, "is null")
        columns[f.name] = col
    groups = columns["group_id"].to_pylist()
    samples = columns["sample_idx"].to_pylist()
    for row, (gid, idx) in enumerate(zip(groups, samples)):
        if idx != row % group_size or gid != groups[row - row % group_size]:
            raise InboxError(url, row, "sample_idx" if idx != row % group_size else "group_id",
                             f"rows must come as whole groups of {group_size}, sample_idx 0..{group_size - 1} "
                             f"under one group_id")
    for row, (resp, logps, length) in enumerate(zip(columns["response_token_ids"].to_pylist(),
                                                    columns["sampler_logprobs"].to_pylist(),
                                                    columns["response_length"].to_pylist())):
        if not resp:
            raise InboxError(url, row, "response_token_ids", "is empty")
        if len(logps) != len(resp):
            raise InboxError(url, row, "sampler_logprobs", f"has {len(logps)} values for {len(resp)} tokens")
        if length != len(resp):
            raise InboxError(url, row, "response_length", f"is {length}, the response has {len(resp)} tokens")
    if RESPONSE_MASK in table.column_names:  # multi-turn episodes: which tokens the policy sampled
        columns[RESPONSE_MASK] = _checked_mask(table, url)
    for row, reward in enumerate(columns["reward"].to_pylist()):
        if reward is not None and not math.isfinite(reward):
            raise InboxError(url, row, "reward", f"is {reward}")
    out = table
    for name, col in columns.items():
        out = out.set_column(out.column_names.index(name), name, col)
    return out


def _checked_mask(table: pa.Table, url: str) -> pa.ChunkedArray:
    """An episode item's ``response_mask``: one 0/1 per response token, some 1 (the policy sampled something)."""
    target = pa.list_(pa.int8())
    try:
        col = table.column(RESPONSE_MASK).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InboxError(url, None, RESPONSE_MASK, f"has type {table.column(RESPONSE_MASK).type}, expected "
                                                   f"{target}: {exc}") from None
    for row, (mask, resp) in enumerate(zip(col.to_pylist(), table.column("response_token_ids").to_pylist())):
        if mask is None or len(mask) != len(resp):
            raise InboxError(url, row, RESPONSE_MASK, f"has {0 if mask is None else len(mask)} values for "
                                                      f"{len(resp)} tokens")
        if any(m not in (0, 1) for m in mask) or 1 not in mask:
            raise InboxError(url, row, RESPONSE_MASK, "must be 0 (environment) or 1 (policy) per token, with "
                                                      "at least one 1")
    return col


@dataclass
class Taken:
    """What one iteration took from the inbox: the rows (renumbered for the iteration), the item names, how many
    groups, and the items refused on the way."""
    table: pa.Table | None = None
    items: list[str] = field(default_factory=list)
    groups: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)


def put_item(store: RunStore, name: str, table: pa.Table) -> None:
    """Write one inbox item as a producer must: the rows, then ``<name>.ready`` (the item is complete)."""
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    store.put_bytes(f"{INBOX}/{name}.parquet", buf.getvalue().to_pybytes())
    store.put_bytes(f"{INBOX}/{name}{READY_SUFFIX}", b"")


def ready_items(store: RunStore) -> list[str]:
    """Names of complete items (``<name>.parquet`` with ``<name>.ready``), oldest name first."""
    files = {rel for rel in store.list_files(INBOX) if "/" not in rel}
    return sorted(rel[: -len(READY_SUFFIX)] for rel in files
                  if rel.endswith(READY_SUFFIX) and rel[: -len(READY_SUFFIX)] + ".parquet" in files)


def reject(store: RunStore, name: str, error: dict[str, Any]) -> None:
    """Keep a refused item under inbox/rejected/ with the reason next to it."""
    store.put_bytes(f"{REJECTED}/{name}.parquet", store.get_bytes(f"{INBOX}/{name}.parquet"))
    store.put_json_file(f"{REJECTED}/{name}.error.json", error)
    store.delete(f"{INBOX}/{name}.parquet")
    store.delete(f"{INBOX}/{name}{READY_SUFFIX}")


def take(store: RunStore, *, iteration: int, group_size: int, batch_groups: int, oldest_version: int,
         newest_version: int, own_groups: int = 1) -> Taken:
    """Read, check and take complete items that fit in ``batch_groups - own_groups`` groups (``own_groups`` left to
    our samplers: at least one, or none when the run is an Atropos trainer) and whose rows were sampled
    with a policy version in [oldest_version, newest_version]; reject bad and stale ones. Items that do not fit
    wait. The k taken groups become the last k groups of the iteration (group ids batch_groups - k ..), with
    ``iteration`` set and prompt_id and sampler_id -1."""
    taken = Taken()
    max_groups = batch_groups - own_groups
    tables = []
    room = max_groups
    for name in ready_items(store):
        url = store.url(f"{INBOX}/{name}.parquet")
        try:
            table = pq.read_table(pa.BufferReader(store.get_bytes(f"{INBOX}/{name}.parquet")))
        except (pa.ArrowInvalid, OSError) as exc:
            error = InboxError(url, None, None, f"not a readable Parquet file: {exc}")
            reject(store, name, error.as_dict())
            taken.rejected.append(error.as_dict())
            continue
        try:
            table = validate(table, url, group_size)
            versions = table.column("policy_version").to_pylist()
            for row, v in enumerate(versions):
                if not oldest_version <= v <= newest_version:
                    raise InboxError(url, row, "policy_version",
                                     f"{v} is outside the versions iteration {iteration} may train on "
                                     f"({oldest_version}..{newest_version}: rollout.max_staleness)")
        except InboxError as error:
            reject(store, name, error.as_dict())
            taken.rejected.append(error.as_dict())
            continue
        groups = table.num_rows // group_size
        if groups > room:
            continue  # waits for an iteration with room
        room -= groups
        tables.append(table)
        taken.items.append(name)
    if tables:
        rows = sum(t.num_rows for t in tables)
        taken.groups = rows // group_size
        first_group_id = batch_groups - taken.groups
        merged = pa.concat_tables(tables, promote_options="default")
        ours = {"iteration": pa.array([iteration] * rows, pa.int64()),
                "prompt_id": pa.array([-1] * rows, pa.int64()),
                "group_id": pa.array([first_group_id + r // group_size for r in range(rows)], pa.int64()),
                "sampler_id": pa.array([OUTSIDE_SAMPLER] * rows, pa.int32())}
        for name, col in ours.items():
            if name in merged.column_names:
                merged = merged.set_column(merged.column_names.index(name), name, col)
            else:
                merged = merged.append_column(name, col)
        taken.table = merged
    return taken


def consume(store: RunStore, items: list[str]) -> None:
    """Delete taken items (after the iteration's inbox.parquet is committed)."""
    for name in items:
        store.delete(f"{INBOX}/{name}.parquet")
        store.delete(f"{INBOX}/{name}{READY_SUFFIX}")
