"""Writing a built-in task's splits as jsonl files (each replaced atomically, so a reader never sees half a file)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable


def write_jsonl_splits(out_dir: str | Path, splits: Iterable[str],
                       make_rows: Callable[[str], list[dict[str, Any]]]) -> dict[str, Path]:
    """Write ``<split>.jsonl`` under `out_dir` for each split; returns the paths by split."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in splits:
        path = out / f"{split}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in make_rows(split)))
        tmp.replace(path)
        paths[split] = path
    return paths
