"""Models the tests import, made once per machine and reused until an input of the import changes.

The tiny models ship as files (models/); what is still made on the machine is SmolLM2-135M-Instruct, imported from
its wheel's GGUF file (about 2 minutes). `make test` and `make test-e2e` are two pytest processes (CI runs both in
one clone); each would import it again. An import is kept under ``.cache/test-models/<name>-<key>/``, where the key
hashes every input that can change its bytes: the source of the builder's module and of every project module it
imports (read from the code, so an edited importer rebuilds), the files it reads, and the versions of torch and
transformers. A folder is published by an atomic rename after ``BUILT`` is written in it, so an interrupted build is
never reused; a file lock per build makes parallel test workers wait for one build.

``GRPO_TEST_MODEL_CACHE=0`` builds into the session's temporary folder instead (nothing kept).
"""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "test-models"
BUILT = "BUILT"  # written last inside a finished build
PROJECT_PACKAGES = ("grpo_core",)


def project_imports(module: str) -> list[Path]:
    """The source files of ``module`` and of every project module it imports, at any depth (read from the code, so
    the answer does not depend on what this process imported before)."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = _source(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # packages' __init__s run
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return sorted(seen)


def _source(module: str) -> Path | None:
    if module.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def build_key(builder_module: str, inputs: list[Path], extra: str = "") -> str:
    """A hash of what a build of ``builder_module`` reads: the project's modules it imports, ``inputs``, ``extra``."""
    import torch
    import transformers

    digest = hashlib.sha256(f"{builder_module}|{extra}|{torch.__version__}|{transformers.__version__}".encode())
    for path in project_imports(builder_module) + sorted(inputs):
        digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_build(name: str, key: str, build: Callable[[Path], object], scratch: Callable[[], Path]) -> Path:
    """The folder of a finished build of ``name`` with ``key``: reused when present, else made by ``build(dir)``.
    ``scratch()`` gives a throwaway folder, asked for only when the cache is off."""
    if os.environ.get("GRPO_TEST_MODEL_CACHE", "1") == "0":
        out = scratch() / name
        build(out)
        return out
    final = CACHE / f"{name}-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / f"{name}-{key}.lock")):  # parallel test workers: one builds, the others wait for it
        if not (final / BUILT).exists():
            partial = CACHE / f".{name}-{key}-{uuid.uuid4().hex[:8]}"
            try:
                build(partial)
                (partial / BUILT).write_text(key)
                partial.rename(final)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return final
