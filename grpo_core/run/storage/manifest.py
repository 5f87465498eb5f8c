"""Stage outputs of an iteration and the manifest that says which of them are complete.

Why: the run directory is the source of truth for resume (DESIGN.md, "Resume"), and a stage is complete when its
iteration's ``MANIFEST.json`` lists it: nothing else counts. Every write is "data first, manifest last" on top of the
atomic file writes of ``grpo_core.run.storage.files``, so a write that fails part-way leaves the previous manifest intact
and the new file unlisted; a file that exists without a manifest entry (or with a different size or checksum) is
treated as absent. Writers of one run are expected to be one process at a time (the flow): the manifest is
read-modify-written without locking.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_core.run.storage.errors import StageIncomplete, StorageError
from grpo_core.run.storage.files import RunFolder, _json_bytes, parquet_from_bytes

MANIFEST = "MANIFEST.json"
_ITER_DIR = re.compile(r"^iter-(\d{6,})$")


@dataclass
class ManifestEntry:
    """One complete file of an iteration, as its manifest records it."""

    name: str
    rows: int | None
    bytes: int
    sha256: str
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        record = asdict(self)
        del record["name"]
        return record

    @classmethod
    def from_json(cls, name: str, record: dict) -> "ManifestEntry":
        return cls(
            name=name,
            rows=record.get("rows"),
            bytes=int(record["bytes"]),
            sha256=str(record["sha256"]),
            meta=dict(record.get("meta") or {}),
        )


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_name(name: str, suffix: str) -> str:
    """The stored file name: ``name`` as given if it has a suffix, else ``name + suffix``."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"invalid stage file name: {name!r}")
    if name == MANIFEST:
        raise ValueError(f"{MANIFEST} is reserved for the manifest itself")
    return name if "." in name else name + suffix


class StageManifests(RunFolder):
    """The ``iter-NNNNNN/`` folders of a run: stage outputs committed by their manifest."""

    def _iter_rel(self, iteration: int) -> str:
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
        return f"iter-{iteration:06d}"

    def iteration_dir(self, iteration: int) -> str:
        """URL of an iteration's folder, e.g. ``.../iter-000042``."""
        return self._url(self._path(self._iter_rel(iteration)))

    def _manifest_path(self, iteration: int) -> str:
        return self._path(f"{self._iter_rel(iteration)}/{MANIFEST}")

    def read_manifest(self, iteration: int) -> dict[str, ManifestEntry]:
        """Entries of an iteration's manifest ({} when there is none yet)."""
        path = self._manifest_path(iteration)
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            return {name: ManifestEntry.from_json(name, rec) for name, rec in doc["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(f"{self._url(path)}: unreadable manifest: {exc!r}") from exc

    def _commit(self, iteration: int, entry: ManifestEntry) -> None:
        entries = self.read_manifest(iteration)
        entries[entry.name] = entry
        doc = {
            "files": {name: e.to_json() for name, e in sorted(entries.items())},
            "updated": _utc_now(),
        }
        self._write_atomic(self._manifest_path(iteration), _json_bytes(doc, MANIFEST))

    def _put(self, iteration: int, file_name: str, data: bytes, rows: int | None, meta: dict | None) -> ManifestEntry:
        rel = f"{self._iter_rel(iteration)}/{file_name}"
        meta = dict(meta or {})
        _json_bytes(meta, f"meta for {self._url(self._path(rel))}")  # fail before writing anything
        entry = ManifestEntry(name=file_name, rows=rows, bytes=len(data), sha256=_sha256(data), meta=meta)
        self._write_atomic(self._path(rel), data)
        self._commit(iteration, entry)
        return entry

    def put_table(self, iteration: int, name: str, table: pa.Table, meta: dict | None = None) -> ManifestEntry:
        """Write a Parquet table, then list it in the iteration's manifest (the commit)."""
        file_name = _file_name(name, ".parquet")
        if not isinstance(table, pa.Table):
            raise TypeError(f"put_table({file_name!r}) needs a pyarrow.Table, got {type(table).__name__}")
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return self._put(iteration, file_name, sink.getvalue(), table.num_rows, meta)

    def put_json(self, iteration: int, name: str, obj: dict, meta: dict | None = None) -> ManifestEntry:
        """Write a JSON document, then list it in the iteration's manifest (the commit)."""
        file_name = _file_name(name, ".json")
        rel = f"{self._iter_rel(iteration)}/{file_name}"
        data = _json_bytes(obj, self._url(self._path(rel)))
        return self._put(iteration, file_name, data, None, meta)

    def _lookup(self, iteration: int, name: str, suffixes: Iterable[str]) -> tuple[str, ManifestEntry | None]:
        entries = self.read_manifest(iteration)
        if name in entries or "." in name:
            return name, entries.get(name)
        for suffix in suffixes:
            if name + suffix in entries:
                return name + suffix, entries[name + suffix]
        return name, None

    def entry(self, iteration: int, name: str) -> ManifestEntry | None:
        """The manifest entry, or None unless it is listed AND the file exists with the recorded size."""
        file_name, found = self._lookup(iteration, name, (".parquet", ".json"))
        if found is None:
            return None
        size = self._size(self._path(f"{self._iter_rel(iteration)}/{file_name}"))
        return found if size == found.bytes else None

    def _get_complete(self, iteration: int, name: str, suffix: str) -> tuple[bytes, ManifestEntry]:
        file_name, found = self._lookup(iteration, _file_name(name, suffix), ())
        path = self._path(f"{self._iter_rel(iteration)}/{file_name}")
        url = self._url(path)
        if found is None:
            raise StageIncomplete(f"{url}: not listed in {self.iteration_dir(iteration)}/{MANIFEST}")
        try:
            data = self._read(path)
        except FileNotFoundError as exc:
            raise StageIncomplete(f"{url}: listed in the manifest but missing") from exc
        if len(data) != found.bytes or _sha256(data) != found.sha256:
            raise StageIncomplete(
                f"{url}: content differs from the manifest "
                f"({len(data)} bytes vs {found.bytes} recorded, or checksum mismatch)"
            )
        return data, found

    def get_table(self, iteration: int, name: str) -> pa.Table:
        """The table if complete; StageIncomplete (naming the file) otherwise."""
        data, _ = self._get_complete(iteration, name, ".parquet")
        return parquet_from_bytes(data)

    def get_json(self, iteration: int, name: str) -> dict:
        """The JSON document if complete; StageIncomplete (naming the file) otherwise."""
        data, _ = self._get_complete(iteration, name, ".json")
        return json.loads(data)

    def list_complete_iterations(self, required: Iterable[str] = ()) -> list[int]:
        """Iterations whose manifest lists at least one file, every listed file intact (by size),
        and every name in ``required`` (e.g. ``("scored.parquet", "train.json")``; a name without
        a suffix matches ``.parquet`` or ``.json``). One recursive listing plus one manifest read
        per iteration, so resuming a long run on S3 stays cheap."""
        self._refresh(self._base)
        try:
            listing = self._fs.find(self._base, detail=True)
        except FileNotFoundError:
            return []
        sizes = {posixpath.normpath(p): info.get("size") for p, info in listing.items()}
        iterations = sorted(
            {
                int(m.group(1))
                for p in sizes
                if (m := _ITER_DIR.match(posixpath.basename(posixpath.dirname(p))))
                and posixpath.basename(p) == MANIFEST
                and posixpath.dirname(posixpath.dirname(p)) == posixpath.normpath(self._base)
            }
        )
        required = tuple(required)
        done: list[int] = []
        for iteration in iterations:
            entries = self.read_manifest(iteration)
            if not entries:
                continue
            if any(not ({r, r + ".parquet", r + ".json"} & entries.keys()) for r in required):
                continue
            folder = posixpath.normpath(self._path(self._iter_rel(iteration)))
            if all(sizes.get(posixpath.join(folder, n)) == e.bytes for n, e in entries.items()):
                done.append(iteration)
        return done
