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


def _modules(path: Path) -> set[str]:
    """Full dotted name of every module a file imports (anywhere in it, lazily or not)."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", ["grpo_core/engine/rollout", "grpo_core/engine/train"])
def test_rollout_and_train_never_import_the_weight_transports(package):
    """The transports know both ends (``weights/`` imports ``rollout/`` and ``train/``), never the reverse."""
    bad = {str(f.relative_to(REPO)): sorted(m for m in _modules(f)
                                            if m == "grpo_core.weights" or m.startswith("grpo_core.weights."))
           for f in _files(package)}
    assert {f: m for f, m in bad.items() if m} == {}


TRANSPORT_KINDS = {"inprocess", "broadcast", "files", "cuda_ipc"}


def name_comparisons(path: Path, names: set[str]) -> list[int]:
    """Lines where one of ``names`` is compared with something (``x == "files"``, ``t in ("broadcast", ...)``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                lines.append(node.lineno)
    return lines


def _kind_comparisons(path: Path) -> list[int]:
    return name_comparisons(path, TRANSPORT_KINDS)


def test_the_transport_kind_is_branched_on_only_where_it_is_chosen():
    """One class per kind behind ``grpo_core.weights.transport``: no other module asks a transport for its name."""
    allowed = {"grpo_core/weights/transport.py"}
    found = {str(f.relative_to(REPO)): _kind_comparisons(f)
             for package in ("grpo_core", "tasks", "flows", "grpo_cli") for f in _files(package)}
    assert {f: lines for f, lines in found.items() if lines and f not in allowed} == {}


def test_the_kind_check_finds_a_branch():
    """The check above can fail: it sees the comparisons it forbids."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.py"
        path.write_text('def f(cfg):\n    if cfg.transport == "files":\n        return 1\n'
                        '    return cfg.transport in ("broadcast", "cuda_ipc")\n')
        assert _kind_comparisons(path) == [2, 4]
