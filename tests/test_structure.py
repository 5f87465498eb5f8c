"""The code's shape, checked so that it stays: the placement's name is branched on only where it is chosen, the
driver side returns typed results, no function grows past a screenful or two, and grpo_core has no import circle.
Each check is tried on a small sample it must reject, so that it can fail."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO
from tests.test_imports import name_comparisons

PLACEMENT_KINDS = {"colocate", "split", "external"}
PACKAGES = ("grpo_core", "tasks", "flows", "grpo_cli")


def _files(*packages: str) -> list[Path]:
    return sorted(f for p in packages for f in ((REPO / p).rglob("*.py") if (REPO / p).is_dir() else [REPO / p]))


def placement_comparisons(path: Path) -> list[int]:
    """Lines where a placement's name is compared with something (``c.placement == "split"``, ``p in ("colocate",
    ...)``)."""
    return name_comparisons(path, PLACEMENT_KINDS)


def test_the_placement_is_branched_on_only_where_it_is_chosen():
    """One class per placement (``grpo_core.config.placements``, and one sampler fleet per placement in the cluster
    layer): no module compares ``cluster.placement`` with a name."""
    found = {str(f.relative_to(REPO)): placement_comparisons(f) for f in _files(*PACKAGES)}
    assert {f: lines for f, lines in found.items() if lines and f != "grpo_core/config/placements.py"} == {}


def test_the_placement_check_finds_a_branch(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f(cfg):\n    if cfg.cluster.placement == "split":\n        return 1\n'
                    '    return cfg.cluster.placement in ("colocate", "external")\n')
    assert placement_comparisons(path) == [2, 4]


# What says which kind of run a config is (grpo_core.config.run_kinds) and where its batches come from
# (tasks/batch_sources.py): read only by those two factories and the config that holds the sections.
KIND_AND_SOURCE_FACTORIES = {"grpo_core/config/run_kinds.py", "tasks/batch_sources.py", "grpo_core/config/run.py",
                             "grpo_core/config/learning.py", "grpo_core/config/sampling.py"}
_KIND_AND_SOURCE_FIELDS = {"sft", "distill", "atropos", "clients", "filter_groups"}


def _conditions(tree: ast.AST) -> list[ast.expr]:
    """Every expression a branch is decided on: ``if``, ``while``, ``x if c else y``, ``and``/``or``, ``assert``,
    a comprehension's ``if``."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            out.append(node.test)
        elif isinstance(node, ast.BoolOp):
            out.extend(node.values)
        elif isinstance(node, ast.comprehension):
            out.extend(node.ifs)
    return out


def kind_and_source_reads(path: Path) -> list[int]:
    """Lines that branch on a config field deciding the run's kind or its batch source (``if cfg.sft is not None``,
    ``... if ctx.cfg.algo.filter_groups else ...``, ``cfg.atropos or cfg.endpoint.clients``); reading a setting
    of the section (``cfg.distill.reward_weight``) is not branching on it."""
    lines = set()
    for test in _conditions(ast.parse(path.read_text(), str(path))):
        for node in ast.walk(test):
            if isinstance(node, ast.Attribute) and node.attr in _KIND_AND_SOURCE_FIELDS:
                owner = ast.unparse(node.value)
                if owner.endswith(("cfg", "cfg.algo", "cfg.endpoint")):
                    lines.add(node.lineno)
    return sorted(lines)


def test_the_run_kind_and_the_batch_source_are_read_only_where_they_are_chosen():
    """One class per run kind and per batch source: the flow and its tasks ask ``cfg.kind`` and their source,
    never the sections that decide them."""
    found = {str(f.relative_to(REPO)): kind_and_source_reads(f) for f in _files(*PACKAGES)}
    assert {f: lines for f, lines in found.items() if lines and f not in KIND_AND_SOURCE_FACTORIES} == {}


def test_the_kind_and_source_check_finds_a_branch(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(ctx, cfg):\n    if cfg.sft is not None:\n        return 1\n"
                    "    n = 2 if ctx.cfg.algo.filter_groups else 1\n"
                    "    return ctx.cfg.distill or cfg.endpoint.clients\n")
    assert kind_and_source_reads(path) == [2, 4, 5]
    path.write_text("def f(cfg):\n    return cfg.distill.reward_weight, g(dynamic=cfg.algo.filter_groups)\n")
    assert kind_and_source_reads(path) == []


def _is_flow(decorator: ast.expr) -> bool:
    """``@flow`` or ``@flow(...)``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Name) and target.id == "flow"


def untyped_returns(path: Path) -> list[str]:
    """Functions whose return annotation is ``dict[str, Any]`` (optionally ``| None``), but Prefect flows: a flow's
    return value is what Prefect keeps as the flow run's result (a dict, which the UI and a parent flow read)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None \
                and "dict[str, Any]" in ast.unparse(node.returns) \
                and not any(_is_flow(d) for d in node.decorator_list):
            out.append(f"{path.relative_to(REPO)}:{node.name}")
    return out


def test_the_stage_path_returns_typed_results():
    """Between the engine actors and the flow, results are dataclasses (``grpo_core.engine.results``); what remains as a
    dict is a manifest's free-form metadata and a metrics row (a flow's own return value is not counted)."""
    found = [name for f in _files("flows", "tasks", "grpo_core/cluster", "grpo_core/engine/roles", "grpo_core/engine/worker.py")
             for name in untyped_returns(f)]
    assert len(found) <= 7, found


def long_functions(path: Path, limit: int = 80) -> list[str]:
    return [f"{path.relative_to(REPO)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_over_80_lines():
    assert [name for f in _files("grpo_core", "flows", "tasks") for name in long_functions(f)] == []


def test_grpo_core_is_laid_out_by_plane_and_no_file_is_over_600_lines():
    """At most 14 entries at grpo_core's top level (packages by plane, docs/concepts/architecture.md); a module that
    grows past 600 lines is split by what it does."""
    top = sorted(p.name for p in (REPO / "grpo_core").iterdir()  # (a folder left with bytecode only is no entry)
                 if p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py"))))
    assert len(top) <= 14, top
    long = {str(f.relative_to(REPO)): n for f in _files("grpo_core", "flows", "tasks")
            if (n := len(f.read_text().splitlines())) > 600}
    assert long == {}


def test_the_engines_lifecycle_stays_small():
    """What stays of the engines' class is their lifecycle; the handles (learner group, sampler fleet, weight sync)
    are modules of their own."""
    assert len((REPO / "grpo_core/cluster/engines.py").read_text().splitlines()) < 250


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at run time (anywhere in the file, lazily or not;
    ``if TYPE_CHECKING:`` blocks are not imports)."""
    modules = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(root.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = f
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, f in modules.items():
        tree = ast.parse(f.read_text(), str(f))
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [node.module, *subs]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != root.name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_grpo_core_has_no_import_circle():
    assert cycles(import_graph(REPO / "grpo_core")) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


OUR_PACKAGES = ("grpo_core", "grpo_cli", "tasks", "flows", "tests")


def our_imports(path: Path) -> list[str]:
    """The project's own modules that ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [n for n in names if n.split(".")[0] in OUR_PACKAGES]
    return found


def test_outside_programs_import_nothing_of_the_project():
    """What runs in .venv-envs and .venv-verifiers (the OpenEnv and verifiers drivers, the Atropos, OpenEnv and
    verifiers examples) talks to the run over HTTP only: grpo_core and its dependencies are not installed there."""
    found = {str(f.relative_to(REPO)): our_imports(f) for f in _files("grpo_outside", "examples/atropos",
                                                                     "examples/openenv", "examples/verifiers")}
    assert len(found) >= 5 and {f: names for f, names in found.items() if names} == {}


def test_the_outside_import_check_finds_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import json\nfrom grpo_core.config import load_config\nimport tasks.inbox\n")
    assert our_imports(path) == ["grpo_core.config", "tasks.inbox"]
