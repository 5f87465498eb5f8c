"""The run's ``metrics.parquet``: one row per iteration, appended as the run goes.

Why: the metrics of a run outlive its processes (the report, the curves and a resumed run read them back), so rows
are kept in the run folder, with types that stay stable as columns come and go, and a resume that redoes iterations
drops their rows first. The flow appends every iteration, so the table this store last wrote is kept in memory
rather than read back each time.
"""

from __future__ import annotations

import io
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from grpo_core.run.storage.errors import MetricsSchemaError, StorageError
from grpo_core.run.storage.files import RunFolder, parquet_from_bytes

METRICS = "metrics.parquet"
ITERATION_KEY = "iteration"


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


class MetricsTable(RunFolder):
    """The metrics rows of a run, read, appended and truncated in its folder."""

    def __init__(self, root: str, run_name: str, storage_options: dict | None = None):
        super().__init__(root, run_name, storage_options)
        # metrics.parquet as this store last wrote it, with the file's (inode, size, mtime) then (local folders
        # only): the flow appends a row every iteration, and reading the whole file back each time grew with the run.
        self._metrics_written: tuple[tuple[int, int, int], pa.Table] | None = None

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
