"""Are two runs the same run? Compares two run folders: every metrics row (timings aside), every iteration's
rollout and scored rows, and the final weights byte for byte. Used to check that a refactoring changed nothing a
run computes (run the same config before and after, into two folders).

    git worktree add /tmp/before <commit-before> && (cd /tmp/before && PYTHONPATH=$PWD grpo train \\
        --config configs/tiny.yaml --set iterations=20 --set run_name=before --set storage.root=/tmp/eq)
    grpo train --config configs/tiny.yaml --set iterations=20 --set run_name=after --set storage.root=/tmp/eq
    python benchmarks/same_run.py /tmp/eq/before /tmp/eq/after

Prints what differs and exits 1, or prints what was compared and exits 0.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

# Columns that measure time (wall seconds, stage timestamps) or the attempt, not what the run computed.
_TIMING = ("time_", "_started_at", "_ended_at", "seconds", "checkpoint_snapshot_s")
# Per-row columns of the stage files that are timings too, and the same key inside a JSON column's values (a tool
# call's seconds in a multi-turn episode's ``episode_turns``).
_ROW_TIMING = ("seconds",)


def _timing(column: str) -> bool:
    return column.startswith(_TIMING[0]) or column.endswith(_TIMING[1:])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare_metrics(a: Path, b: Path) -> list[str]:
    ta, tb = pq.read_table(a / "metrics.parquet"), pq.read_table(b / "metrics.parquet")
    problems = []
    if set(ta.column_names) != set(tb.column_names):
        problems.append(f"metrics columns differ: only before {sorted(set(ta.column_names) - set(tb.column_names))}, "
                        f"only after {sorted(set(tb.column_names) - set(ta.column_names))}")
    if ta.num_rows != tb.num_rows:
        problems.append(f"metrics rows: {ta.num_rows} before, {tb.num_rows} after")
    for col in sorted(set(ta.column_names) & set(tb.column_names)):
        if _timing(col):
            continue
        va, vb = ta.column(col).to_pylist(), tb.column(col).to_pylist()
        if va != vb:
            at = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y) if len(va) == len(vb) else None
            problems.append(f"metrics column {col} differs" + (f" (first at row {at}: {va[at]!r} vs {vb[at]!r})"
                                                                if at is not None else ""))
    return problems


def compare_stage_files(a: Path, b: Path) -> tuple[int, list[str]]:
    problems, compared = [], 0
    for folder in sorted(p for p in a.iterdir() if p.name.startswith("iter-")):
        for f in sorted(folder.glob("*.parquet")):
            other = b / folder.name / f.name
            if not other.exists():
                problems.append(f"{folder.name}/{f.name} missing after")
                continue
            ta, tb = pq.read_table(f), pq.read_table(other)
            cols = [c for c in ta.column_names if c not in _ROW_TIMING]
            if cols != [c for c in tb.column_names if c not in _ROW_TIMING] or \
                    any(_untimed(ta.column(c).to_pylist()) != _untimed(tb.column(c).to_pylist()) for c in cols):
                problems.append(f"{folder.name}/{f.name} differs")
            compared += 1
    return compared, problems


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in _ROW_TIMING}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _untimed(values: list) -> list:
    """A column's values, with the timing keys left out of the JSON documents among them."""
    out = []
    for v in values:
        if isinstance(v, str) and v[:1] in "[{":
            try:
                v = _without_timing(json.loads(v))
            except json.JSONDecodeError:
                pass
        out.append(v)
    return out


def compare_weights(a: Path, b: Path) -> tuple[int, list[str]]:
    problems, compared = [], 0
    for f in sorted((a / "final").glob("*.safetensors")):
        other = b / "final" / f.name
        if not other.exists() or _sha(f) != _sha(other):
            problems.append(f"final/{f.name} differs")
        compared += 1
    if not compared:
        problems.append(f"{a}/final holds no weights")
    return compared, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    problems = compare_metrics(args.before, args.after)
    files, more = compare_stage_files(args.before, args.after)
    weights, most = compare_weights(args.before, args.after)
    problems += more + most
    for line in problems:
        print(line)
    if problems:
        return 1
    rows = pq.read_table(args.before / "metrics.parquet").num_rows
    print(f"same run: {rows} metrics rows (timings aside), {files} stage files, {weights} final weight file(s) "
          "identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
