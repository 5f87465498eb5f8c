"""A file of the run folder only its owner may read (``endpoint.json``: it holds the endpoint's bearer token): on a
local disk it is 0600 from its first byte (``grpo_core.run.storage.atomic_file``). On an object store (no file modes)
it is written as any run file, readable by whoever can read the bucket."""
from __future__ import annotations

from grpo_core.run.storage import RunStore
from grpo_core.run.storage.atomic_file import write_private


def write_owner_only(store: RunStore, rel_path: str, data: bytes) -> None:
    path = store.local_path(rel_path)
    if path is None:
        store.put_bytes(rel_path, data)
    else:
        write_private(path, data)
