"""The run folder on any fsspec URL: stage outputs, their manifests, config and metrics.

Why: the run directory is the source of truth for resume (DESIGN.md, "Resume"). ``RunStore`` is the one object the
rest of the code holds; it is composed of one class per job, each in its own module:

* ``files``: paths and atomic file I/O on fsspec, listing and deletion (what checkpoints are stored with);
* ``manifest``: per-iteration stage outputs, complete only once their ``MANIFEST.json`` lists them;
* ``run_config``: ``config.json``, written once and compared on every resume;
* ``metrics``: ``metrics.parquet``, one row per iteration;
* ``errors``: the errors all of them raise, and which I/O errors are worth retrying.

Layout (``<root>/<run_name>/``)::

    config.json            written once (a different config on resume is an error)
    metrics.parquet        one row per iteration
    iter-000042/<name>     stage outputs (parquet tables, json documents)
    iter-000042/MANIFEST.json
"""

from __future__ import annotations

from grpo_core.run.storage.errors import (
    ConfigConflict,
    MetricsSchemaError,
    StageIncomplete,
    StorageError,
    is_transient_io_error,
)
from grpo_core.run.storage.files import parquet_from_bytes
from grpo_core.run.storage.manifest import MANIFEST, ManifestEntry, StageManifests
from grpo_core.run.storage.metrics import ITERATION_KEY, METRICS, MetricsTable
from grpo_core.run.storage.run_config import CONFIG, RunConfigFile


class RunStore(StageManifests, RunConfigFile, MetricsTable):
    """A run folder on any fsspec URL (local path by default, s3://bucket/prefix with options)."""

    def __repr__(self) -> str:
        return f"RunStore({self.uri!r})"


__all__ = [
    "CONFIG",
    "ConfigConflict",
    "ITERATION_KEY",
    "is_transient_io_error",
    "MANIFEST",
    "ManifestEntry",
    "METRICS",
    "MetricsSchemaError",
    "parquet_from_bytes",
    "RunStore",
    "StageIncomplete",
    "StorageError",
]
