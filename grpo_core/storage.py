"""The run folder on any fsspec URL: stage outputs, their manifests, config and metrics.

Why: the run directory is the source of truth for resume (DESIGN.md, "Resume"). A stage is
complete when its iteration's ``MANIFEST.json`` lists it, and nothing else counts. Object
stores cannot rename atomically, so every write is "data first, manifest last":

* on a local disk each file is written to a temporary name in the same folder, fsynced and
  renamed into place, so no reader ever sees a half-written file under its final name;
* on S3 a single PUT (or a completed multipart upload) is atomic per object.

A write that fails part-way therefore leaves the previous manifest intact and the new file
unlisted; a file that exists without a manifest entry (or with a different size or checksum)
is treated as absent. Writers of one run are expected to be one process at a time (the flow):
the manifest is read-modify-written without locking.

Layout (``<root>/<run_name>/``)::

    config.json            written once (a different config on resume is an error)
    metrics.parquet        one row per iteration
    iter-000042/<name>     stage outputs (parquet tables, json documents)
    iter-000042/MANIFEST.json
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

MANIFEST = "MANIFEST.json"
CONFIG = "config.json"
METRICS = "metrics.parquet"
ITERATION_KEY = "iteration"
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


class StageIncomplete(FileNotFoundError):
    """A stage output is not complete: unlisted in its manifest, missing, or not what was recorded."""


class ConfigConflict(ValueError):
    """``write_config`` was given a config that differs from the one the run was started with."""


class MetricsSchemaError(TypeError):
    """A metrics row does not fit the types already stored in metrics.parquet."""


class StorageError(OSError):
    """A run-folder file exists but cannot be understood (e.g. a manifest that is not JSON)."""


_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EAGAIN}
# Exception classes of the object-store client stack (botocore, aiohttp, fsspec) that mean "the service did not
# answer", matched by module and name so that this module does not import them.
_TRANSIENT_CLASSES = {("botocore.exceptions", "ConnectionError"), ("botocore.exceptions", "HTTPClientError"),
                      ("aiohttp.client_exceptions", "ClientConnectionError"),
                      ("aiohttp.client_exceptions", "ServerTimeoutError"), ("fsspec.exceptions", "FSTimeoutError")}


def is_transient_io_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything in its cause chain, including the cause an actor raised) is the storage service
    not answering (connection refused or reset, timeout): worth retrying, unlike a missing file or a bad value."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if any((c.__module__, c.__name__) in _TRANSIENT_CLASSES for c in type(e).__mro__):
            return True
        todo.extend([e.__cause__, e.__context__, getattr(e, "cause", None)])
    return False


def parquet_from_bytes(data: bytes) -> pa.Table:
    """A Parquet file's table. ``pq.ParquetFile(...).read()``, not ``pq.read_table``: the latter goes through the
    dataset layer, 2.3 ms against 0.4 ms for a tiny-task rollout file, read several times an iteration."""
    return pq.ParquetFile(pa.BufferReader(data)).read()


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_rel_path(rel_path: str) -> str:
    """A relative POSIX path inside the run folder (no absolute paths, no '..')."""
    parts = rel_path.replace("\\", "/").split("/")
    if not rel_path or rel_path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid path inside a run folder: {rel_path!r}")
    return "/".join(parts)


def _file_name(name: str, suffix: str) -> str:
    """The stored file name: ``name`` as given if it has a suffix, else ``name + suffix``."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"invalid stage file name: {name!r}")
    if name == MANIFEST:
        raise ValueError(f"{MANIFEST} is reserved for the manifest itself")
    return name if "." in name else name + suffix


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not JSON-serializable: {exc}") from exc


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _lookup_dotted(tree: Any, dotted: str) -> str:
    node = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return "(absent)"
        node = node[key]
    return json.dumps(node)


def _dict_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like values."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                keys.append(path)
            else:
                keys.extend(_dict_diff(old[k], new[k], path))
        return keys
    return [] if old == new else [prefix or "<root>"]


class RunStore:
    """A run folder on any fsspec URL (local path by default, s3://bucket/prefix with options)."""

    def __init__(self, root: str, run_name: str, storage_options: dict | None = None):
        if not run_name or "/" in run_name or run_name in (".", ".."):
            raise ValueError(f"invalid run name: {run_name!r}")
        self._fs, root_path = fsspec.core.url_to_fs(str(root), **(storage_options or {}))
        self._local = isinstance(self._fs, LocalFileSystem)
        self._base = posixpath.join(root_path.rstrip("/"), run_name)
        self.run_name = run_name
        # metrics.parquet as this store last wrote it, with the file's (inode, size, mtime) then (local folders
        # only): the flow appends a row every iteration, and reading the whole file back each time grew with the run.
        self._metrics_written: tuple[tuple[int, int, int], pa.Table] | None = None

    # ----------------------------------------------------------------- paths
    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._fs

    @property
    def uri(self) -> str:
        """Full URL of the run folder (a plain absolute path for local runs)."""
        return self._url(self._base)

    def _url(self, path: str) -> str:
        return path if self._local else self._fs.unstrip_protocol(path)

    def _path(self, rel_path: str) -> str:
        return posixpath.join(self._base, _check_rel_path(rel_path))

    def _iter_rel(self, iteration: int) -> str:
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
        return f"iter-{iteration:06d}"

    def iteration_dir(self, iteration: int) -> str:
        """URL of an iteration's folder, e.g. ``.../iter-000042``."""
        return self._url(self._path(self._iter_rel(iteration)))

    # ------------------------------------------------------------ raw bytes
    def _refresh(self, path: str) -> None:
        """Forget cached listings (s3fs caches them) so other writers' files are seen."""
        if not self._local:
            self._fs.invalidate_cache(path)
            self._fs.invalidate_cache(posixpath.dirname(path))

    def _write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that ``path`` holds either the old content or all of the new."""
        if self._local:
            parent = posixpath.dirname(path)
            os.makedirs(parent, exist_ok=True)
            # os.open with 0o666 (not mkstemp's 0o600) so the file gets the usual umask permissions.
            tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
        else:
            self._fs.pipe_file(path, data)
            self._refresh(posixpath.dirname(path))

    def _read(self, path: str) -> bytes:
        """Bytes of ``path``; FileNotFoundError if missing."""
        self._refresh(posixpath.dirname(path))
        return self._fs.cat_file(path)

    def _size(self, path: str) -> int | None:
        self._refresh(posixpath.dirname(path))
        try:
            return int(self._fs.size(path))
        except FileNotFoundError:
            return None

    def put_bytes(self, rel_path: str, data: bytes) -> None:
        """Write a file inside the run folder atomically (e.g. the curve PNG)."""
        self._write_atomic(self._path(rel_path), bytes(data))

    def get_bytes(self, rel_path: str) -> bytes:
        path = self._path(rel_path)
        try:
            return self._read(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{self._url(path)} does not exist") from exc

    def exists(self, rel_path: str) -> bool:
        path = self._path(rel_path)
        self._refresh(posixpath.dirname(path))
        return bool(self._fs.exists(path))

    def get_json_file(self, rel_path: str) -> Any | None:
        """A run-level JSON document (latest.json, status.json); None when it does not exist."""
        path = self._path(rel_path)
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise StorageError(f"{self._url(path)}: not valid JSON: {exc}") from exc

    def put_json_file(self, rel_path: str, obj: Any) -> None:
        """Write a run-level JSON document atomically."""
        path = self._path(rel_path)
        self._write_atomic(path, _json_bytes(obj, self._url(path)))

    # ------------------------------------------------------- whole files and folders (checkpoints)
    @property
    def is_local(self) -> bool:
        return self._local

    def local_path(self, rel_path: str) -> str | None:
        """The absolute local path of ``rel_path`` when the run folder is on a local disk, else None."""
        return self._path(rel_path) if self._local else None

    def url(self, rel_path: str) -> str:
        return self._url(self._path(rel_path))

    def put_file(self, rel_path: str, local_file: str) -> None:
        """Copy a local file into the run folder, streamed (large checkpoint files never sit in memory whole).
        Locally the copy goes to a temporary name and is renamed into place."""
        path = self._path(rel_path)
        if self._local:
            if os.path.abspath(local_file) == os.path.abspath(path):
                return
            parent = posixpath.dirname(path)
            os.makedirs(parent, exist_ok=True)
            tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
            try:
                shutil.copyfile(local_file, tmp)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:
            self._fs.put_file(local_file, path)
            self._refresh(posixpath.dirname(path))

    def get_file(self, rel_path: str, local_file: str) -> None:
        """Copy a file of the run folder to a local path."""
        path = self._path(rel_path)
        os.makedirs(os.path.dirname(os.path.abspath(local_file)), exist_ok=True)
        self._refresh(posixpath.dirname(path))
        self._fs.get_file(path, local_file)

    def list_files(self, rel_dir: str) -> dict[str, int]:
        """Every file under ``rel_dir`` (recursive) as ``{path relative to rel_dir: size}``; {} if absent.
        Folder markers (some S3 servers keep empty "directories") are not files."""
        base = self._path(rel_dir)
        self._refresh(base)
        try:
            found = self._fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        base_norm = posixpath.normpath(base)
        out = {}
        for p, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = posixpath.relpath(posixpath.normpath(self._fs._strip_protocol(p)), base_norm)
            if rel != "." and not rel.startswith(".."):
                out[rel] = int(info.get("size") or 0)
        return out

    def list_dirs(self, rel_dir: str) -> list[str]:
        """Names of the folders directly under ``rel_dir`` that hold at least one file (sorted)."""
        return sorted({rel.split("/", 1)[0] for rel in self.list_files(rel_dir) if "/" in rel})

    def delete(self, rel_path: str) -> None:
        """Remove a file or a folder (recursively); nothing if absent."""
        path = self._path(rel_path)
        self._refresh(posixpath.dirname(path))
        if self._local:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
            return
        try:
            self._fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        self._refresh(path)
        self._refresh(posixpath.dirname(path))

    # -------------------------------------------------------------- manifest
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

    # ---------------------------------------------------------------- config
    def read_config(self) -> dict | None:
        path = self._path(CONFIG)
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise StorageError(f"{self._url(path)}: not valid JSON: {exc}") from exc

    def check_config(self, config: dict, may_change: Iterable[str] = (),
                     upgrade: Callable[[dict], dict] | None = None) -> list[str]:
        """Compare ``config`` with config.json (see ``write_config``) without writing anything: returns the
        allowed changes as ``["key: old -> new", ...]``, raises ConfigConflict for any other difference.
        ``upgrade`` brings the stored config to the current schema first (fields added since it was written, at
        their defaults), so that a newer version of the code can resume an older run."""
        path = self._path(CONFIG)
        normalized = json.loads(_json_bytes(config, self._url(path)))
        existing = self.read_config()
        if existing is None:
            return []
        if upgrade is not None:
            existing = upgrade(existing)
        allowed = tuple(may_change)

        def covered(key: str) -> bool:
            return any(key == a or key.startswith(a + ".") for a in allowed)

        def describe(key: str) -> str:
            return f"{key}: {_lookup_dotted(existing, key)} -> {_lookup_dotted(normalized, key)}"

        differing = _dict_diff(existing, normalized)
        conflicts = [describe(k) for k in differing if not covered(k)]
        if conflicts:
            raise ConfigConflict(
                f"{self._url(path)} holds the config this run was started with, and these fields differ: "
                + "; ".join(conflicts) + ". Start a new run (another run_name) to change them."
            )
        return [describe(k) for k in differing]

    def write_config(self, config: dict, may_change: Iterable[str] = (),
                     upgrade: Callable[[dict], dict] | None = None) -> list[str]:
        """Write config.json. On an existing run the same config is a no-op; differences only in fields listed in
        ``may_change`` (dotted keys; a section name covers the section) are written and returned as
        ``["key: old -> new", ...]``; any other difference raises ConfigConflict naming each field with its
        stored and new value."""
        path = self._path(CONFIG)
        data = _json_bytes(config, self._url(path))
        if self.read_config() is None:
            self._write_atomic(path, data)
            return []
        changes = self.check_config(config, may_change, upgrade)
        if changes:
            self._write_atomic(path, data)
        return changes

    # --------------------------------------------------------------- metrics
    def read_metrics(self) -> pa.Table:
        """All metrics rows sorted by iteration (an empty table with only ``iteration`` if none)."""
        path = self._path(METRICS)
        written = self._metrics_written
        if written is not None and written[0] == self._local_stat(path):
            return written[1]
        try:
            raw = self._read(path)
        except FileNotFoundError:
            return pa.table({ITERATION_KEY: pa.array([], pa.int64())})
        try:
            table = parquet_from_bytes(raw)
        except (pa.ArrowInvalid, OSError) as exc:
            raise StorageError(f"{self._url(path)}: unreadable parquet: {exc}") from exc
        return table.sort_by(ITERATION_KEY)

    def _local_stat(self, path: str) -> tuple[int, int, int] | None:
        if not self._local:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _write_metrics(self, table: pa.Table) -> None:
        sink = io.BytesIO()
        pq.write_table(table, sink)
        path = self._path(METRICS)
        self._write_atomic(path, sink.getvalue())
        stat = self._local_stat(path)
        self._metrics_written = (stat, table) if stat is not None else None

    def truncate_metrics(self, first_dropped: int) -> int:
        """Drop the rows of iterations >= ``first_dropped`` (a resumed run redoes them); returns how many."""
        old = self.read_metrics()
        kept = old.filter(pc.less(old[ITERATION_KEY], pa.scalar(first_dropped, pa.int64())))
        if kept.num_rows != old.num_rows:
            self._write_metrics(kept)
        return old.num_rows - kept.num_rows

    def append_metrics(self, row: dict) -> None:
        """Add one iteration's metrics; a row for an existing iteration replaces it.

        Columns may appear over time (older rows get nulls). Types stay stable: an integer
        column becomes float when a float arrives, a null-only column takes the first real
        type, anything else that does not fit raises MetricsSchemaError naming the column.
        """
        url = self._url(self._path(METRICS))
        iteration = row.get(ITERATION_KEY)
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise ValueError(f"{url}: metrics row needs an int 'iteration', got {iteration!r}")
        try:
            new = pa.Table.from_pylist([row])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise MetricsSchemaError(f"{url}: metrics row not representable in Arrow: {exc}") from exc
        new = new.set_column(
            new.schema.get_field_index(ITERATION_KEY), ITERATION_KEY, pa.array([iteration], pa.int64())
        )
        old = self.read_metrics()
        old = old.filter(pc.not_equal(old[ITERATION_KEY], pa.scalar(iteration, pa.int64())))
        for name in new.column_names:
            if name not in old.column_names:
                continue
            want, got = old.schema.field(name).type, new.schema.field(name).type
            if want == got or pa.types.is_null(got) or pa.types.is_null(want):
                continue
            if _is_number(want) and _is_number(got):
                continue  # permissive promotion below widens (int -> float, float32 -> float64)
            raise MetricsSchemaError(
                f"{url}: column {name!r} holds {want}, row {iteration} gives {got} ({row[name]!r})"
            )
        try:
            merged = pa.concat_tables([old, new], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise MetricsSchemaError(f"{url}: row {iteration} does not fit the stored columns: {exc}") from exc
        self._write_metrics(merged.sort_by(ITERATION_KEY))

    def __repr__(self) -> str:
        return f"RunStore({self.uri!r})"


__all__ = [
    "ConfigConflict",
    "is_transient_io_error",
    "ManifestEntry",
    "MetricsSchemaError",
    "RunStore",
    "StageIncomplete",
    "StorageError",
]
