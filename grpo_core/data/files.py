"""Data paths that name many files: a folder of .jsonl/.parquet files or a glob, fixed when a run starts.

Why: scheduled retraining trains "on the newest data": new files land in a folder every day and the next run takes
what is there. A run must not change its data under it, though: a resume (or a Prefect retry) that saw a file more
would shuffle a different prompt stream and no longer repeat the iterations it redoes. So the files are listed once,
at the run's first start, and recorded in ``data_files.json``; later starts of the run read them from there.
"""
from __future__ import annotations

import glob as _glob
import posixpath
from typing import Any

from grpo_core.data.readers import DataError, PromptSet, read_prompts
from grpo_core.run.storage import RunStore

DATA_FILES = "data_files.json"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# A folder written by datasets' save_to_disk is one dataset, not a folder of files.
HF_DATASET_MARKERS = ("dataset_info.json", "state.json")


def resolve_data_files(spec: str, storage_options: dict | None = None) -> list[str]:
    """The files ``spec`` names now, sorted: itself (a file or a save_to_disk folder), the data files of a folder,
    or the matches of a glob. Raises DataError when nothing matches."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(spec, **(storage_options or {}))
    local = isinstance(fs, LocalFileSystem)

    def url(p: str) -> str:
        return p if local else fs.unstrip_protocol(p)

    if _glob.has_magic(path):
        found = sorted(p for p in fs.glob(path) if fs.isdir(p) or p.endswith(DATA_SUFFIXES))
        if not found:
            raise DataError(f"{spec}: the glob matches no data file ({', '.join(DATA_SUFFIXES)} or a save_to_disk "
                            "folder)")
        return [url(p) for p in found]
    if fs.isdir(path):
        names = {posixpath.basename(p.rstrip("/")): p for p in fs.ls(path, detail=False)}
        if any(marker in names for marker in HF_DATASET_MARKERS):
            return [spec]
        found = sorted(p for name, p in names.items() if name.endswith(DATA_SUFFIXES) and not name.startswith("."))
        if not found:
            raise DataError(f"{spec}: the folder holds no data file ({', '.join(DATA_SUFFIXES)}) and is not a "
                            "save_to_disk dataset")
        return [url(p) for p in found]
    return [spec]


def recorded_or_resolved(store: RunStore, specs: dict[str, str | None],
                         storage_options: dict | None = None) -> dict[str, list[str]]:
    """``{"train": [files], "eval": [...]}`` for the run: as recorded at its first start (for the same specs),
    else resolved now and recorded."""
    wanted = {k: v for k, v in specs.items() if v is not None}
    doc = store.get_json_file(DATA_FILES)
    if isinstance(doc, dict) and doc.get("specs") == wanted:
        return doc["files"]
    files = {k: resolve_data_files(v, storage_options) for k, v in wanted.items()}
    store.put_json_file(DATA_FILES, {"specs": wanted, "files": files})
    return files


def read_prompt_files(paths: list[str], **read: Any) -> list[PromptSet]:
    """Read each file (``read_prompts`` options); prompt ids continue from file to file, so they stay unique."""
    sets: list[PromptSet] = []
    offset = 0
    for path in paths:
        part = read_prompts(path, **read)
        for row in part.rows:
            row["prompt_id"] += offset
        offset += len(part.rows) + len(part.skipped)
        sets.append(part)
    return sets


def merged(sets: list[PromptSet]) -> PromptSet:
    """One PromptSet of several files' rows; a skipped row's reason then starts with its file."""
    if len(sets) == 1:
        return sets[0]
    return PromptSet(rows=[row for s in sets for row in s.rows],
                     skipped=[(row, f"{s.source}: {why}") for s in sets for row, why in s.skipped],
                     source=f"{sets[0].source} (+{len(sets) - 1} more files)",
                     refs=[ref for s in sets for ref in s.refs] if all(s.refs or not s.rows for s in sets) else [])
