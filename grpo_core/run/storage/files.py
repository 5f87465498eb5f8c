"""Files of a run folder on any fsspec URL: paths, atomic writes, listing and deletion.

Why: every other part of the run store (manifests, config, metrics) and the checkpoints rely on one guarantee, that
no reader ever sees a half-written file under its final name, and it has to hold on a local disk and on an object
store alike. Object stores cannot rename atomically, so:

* on a local disk each file is written to a temporary name in the same folder, fsynced and renamed into place;
* on S3 a single PUT (or a completed multipart upload) is atomic per object.

This layer knows nothing of iterations or stages; ``RunFolder`` is the base the other jobs of ``RunStore`` build on.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from grpo_core.run.storage.atomic_file import replaced_atomically, write_atomically
from grpo_core.run.storage.errors import StorageError


def parquet_from_bytes(data: bytes) -> pa.Table:
    """A Parquet file's table. ``pq.ParquetFile(...).read()``, not ``pq.read_table``: the latter goes through the
    dataset layer, 2.3 ms against 0.4 ms for a tiny-task rollout file, read several times an iteration."""
    return pq.ParquetFile(pa.BufferReader(data)).read()


def _check_rel_path(rel_path: str) -> str:
    """A relative POSIX path inside the run folder (no absolute paths, no '..')."""
    parts = rel_path.replace("\\", "/").split("/")
    if not rel_path or rel_path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid path inside a run folder: {rel_path!r}")
    return "/".join(parts)


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not JSON-serializable: {exc}") from exc


class RunFolder:
    """A run folder on any fsspec URL (local path by default, s3://bucket/prefix with options): its files."""

    def __init__(self, root: str, run_name: str, storage_options: dict | None = None):
        if not run_name or "/" in run_name or run_name in (".", ".."):
            raise ValueError(f"invalid run name: {run_name!r}")
        self._fs, root_path = fsspec.core.url_to_fs(str(root), **(storage_options or {}))
        self._local = isinstance(self._fs, LocalFileSystem)
        self._base = posixpath.join(root_path.rstrip("/"), run_name)
        self.run_name = run_name

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

    # ------------------------------------------------------------ raw bytes
    def _refresh(self, path: str) -> None:
        """Forget cached listings (s3fs caches them) so other writers' files are seen."""
        if not self._local:
            self._fs.invalidate_cache(path)
            self._fs.invalidate_cache(posixpath.dirname(path))

    def _write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that ``path`` holds either the old content or all of the new."""
        if self._local:
            write_atomically(path, data)  # the usual umask permissions (not mkstemp's 0o600)
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
            with replaced_atomically(path) as tmp:
                shutil.copyfile(local_file, tmp)
        else:
            self._fs.put_file(local_file, path)
            self._refresh(posixpath.dirname(path))

    def move_in(self, rel_dir: str, staging: str) -> None:
        """The files of a local staging folder (a remote run's logs or event files, written locally while it ran)
        put under ``rel_dir``, then the staging folder removed: the copy kept is the run folder's."""
        for name in sorted(os.listdir(staging)):
            self.put_file(f"{rel_dir}/{name}", os.path.join(staging, name))
        shutil.rmtree(staging)

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
