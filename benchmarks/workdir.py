"""The temporary folder of one benchmark call (model, run folders, results), shared by the benchmark scripts."""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def work_folder(prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh folder under /tmp; removed afterwards unless ``keep`` (then its path is printed)."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield work
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
