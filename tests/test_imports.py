"""The import direction: grpo_cli -> flows -> tasks -> grpo_core; only grpo_core/cluster imports Ray; the library
never imports Prefect, the tasks or the flows."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO


def _imports(path: Path) -> set[str]:
    """Top-level package of every module a file imports (anywhere in it, lazily or not)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package,forbidden", [
    ("grpo_core", {"prefect", "flows", "tasks", "grpo_cli"}),
    ("tasks", {"flows", "grpo_cli"}),
    ("flows", {"grpo_cli"}),
])
def test_imports_point_one_way(package, forbidden):
    bad = {str(f.relative_to(REPO)): sorted(_imports(f) & forbidden) for f in _files(package)}
    assert {f: m for f, m in bad.items() if m} == {}


def test_only_the_cluster_layer_imports_ray():
    users = {str(f.relative_to(REPO)) for package in ("grpo_core", "tasks", "flows", "grpo_cli")
             for f in _files(package) if "ray" in _imports(f)}
    assert users and all(u.startswith("grpo_core/cluster/") for u in users), sorted(users)
