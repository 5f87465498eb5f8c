"""How a built-in model folder was made, written beside its weights as ``BUILD.json``.

The tiny models ship as files in ``models/`` so that every machine trains the same weights: their builds are
float-sensitive, and two CPU kinds build slightly different ones from the same recipe. The record says how the
shipped bytes were made (the command, its seed, the commit of the code, torch and transformers, the CPU) and holds
each file's sha256, so that a folder edited by hand, or half replaced, is told apart from the one the record
describes (``check``).
"""
from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_core.run.checkpoint import sha256_file
from grpo_core.lifecycle.lineage import code_version

RECORD = "BUILD.json"


@dataclass(frozen=True)
class BuildRecord:
    command: str  # the `grpo model ...` command line that built the folder
    seed: int
    code: dict[str, Any]  # lineage.code_version(): commit, dirty, where
    versions: dict[str, str]  # python, torch, transformers
    machine: str  # the CPU it was built on (another kind builds other bytes)
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256, every file but this record


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(str(p))
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RECORD}


def write(folder: str | Path, argv: list[str], seed: int) -> BuildRecord:
    """Record how ``folder`` was just built (``argv``: the command's words after the program name)."""
    import torch
    import transformers

    folder = Path(folder)
    record = BuildRecord(command=" ".join(["grpo", *argv]), seed=seed, code=code_version(),
                         versions={"python": sys.version.split()[0], "torch": torch.__version__,
                                   "transformers": transformers.__version__},
                         machine=_cpu_name(), files=_digests(folder))
    (folder / RECORD).write_text(json.dumps(asdict(record), indent=1) + "\n")
    return record


def read(folder: str | Path) -> BuildRecord:
    path = Path(folder) / RECORD
    try:
        return BuildRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a build record ({type(exc).__name__}: {exc})") from None


def check(folder: str | Path) -> list[str]:
    """What differs between ``folder`` and its record: files missing, added or changed (empty when it matches)."""
    folder = Path(folder)
    want, have = read(folder).files, _digests(folder)
    problems = [f"{name}: missing" for name in sorted(want.keys() - have.keys())]
    problems += [f"{name}: not in {RECORD}" for name in sorted(have.keys() - want.keys())]
    problems += [f"{name}: sha256 {have[name][:12]}... is not the recorded {want[name][:12]}..."
                 for name in sorted(want.keys() & have.keys()) if want[name] != have[name]]
    return problems
