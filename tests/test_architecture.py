"""The dependency rules of docs/architecture.md, checked on the source (AST only, nothing imported):
imports point down the layers, no module cycles, no job imports another job, MLflow only behind
vlaeval/tracking, and the pure statistics import neither torch nor MLflow nor Hydra."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from helpers.configs import REPO

PACKAGE = REPO / "vlaeval"
# Lowest first. A module may import only from strictly lower layers (and from its own unit: the
# modules of one package import each other). The same table is drawn in docs/architecture.md.
LAYERS: List[Set[str]] = [
    {"vlaeval"},  # the package's __init__: its version only
    {"errors", "choices", "artifacts", "provenance", "console", "memory", "records"},
    {"store", "devices"},
    {"seqtest", "audit", "validity"},
    {"components"},
    {"config"},
    {"envs", "tracking"},
    {"data"},
    {"policy"},
    {"rollouts"},
    {"gauntlet", "residual", "recipes"},
    {"runs"},
    {"jobs"},
    {"help"},
    {"cli", "callbacks"},
]
PURE_STATISTICS = ("seqtest", "audit", "validity")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The layer unit of a module: its subpackage or top-level module under vlaeval."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path) -> Iterator[Tuple[str, int]]:
    """(imported module, line) for every import in the file, relative imports resolved; a name
    imported from a package (`from vlaeval import console`) counts as that module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def graph() -> Dict[str, Set[Tuple[str, int]]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {(target, line) for target, line in imports(path) if target in modules and target != name}
        for name, path in modules.items()
    }


def layer_of(module: str) -> int:
    u = unit(module)
    found = [i for i, layer in enumerate(LAYERS) if u in layer]
    assert found, f"{module} is in no layer: add its package to LAYERS and to docs/architecture.md"
    return found[0]


def upward_imports(edges: Dict[str, Set[Tuple[str, int]]]) -> List[str]:
    return sorted(
        f"{source}:{line} imports {target}"
        for source, targets in edges.items()
        for target, line in targets
        if unit(source) != unit(target) and layer_of(target) >= layer_of(source)
    )


def test_every_import_points_down_the_layers():
    upward = upward_imports(graph())
    assert not upward, "imports against the layering of docs/architecture.md:\n" + "\n".join(upward)


def import_cycles(graph_edges: Dict[str, Set[Tuple[str, int]]]) -> List[str]:
    edges = {name: {t for t, _ in targets} for name, targets in graph_edges.items()}
    # Package __init__ files re-export their modules; a cycle through a re-export is no cycle.
    edges = {n: {t for t in ts if not (n.startswith(t + ".") or t.startswith(n + "."))} for n, ts in edges.items()}
    state: Dict[str, int] = {}
    cycles: List[str] = []

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycles_between_modules():
    cycles = import_cycles(graph())
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_no_job_imports_another_job():
    jobs = {p.stem for p in (PACKAGE / "jobs").glob("*.py") if p.stem != "__init__"}
    offending = [
        f"{source}:{line} imports {target}"
        for source, targets in graph().items()
        if source.startswith("vlaeval.jobs.")
        for target, line in targets
        if target.startswith("vlaeval.jobs.") and target.split(".")[2] in jobs
    ]
    assert not offending, "shared job code belongs outside vlaeval/jobs/: " + "; ".join(offending)


@pytest.mark.parametrize(
    "forbidden, allowed_units",
    [
        ("mlflow", {"tracking"}),
        ("torch", {"policy", "rollouts", "residual", "data", "memory", "devices", "jobs", "runs"}),
        ("transformers", {"policy"}),  # the VLM-backbone VLA's, imported when it is built
        ("tokenizers", {"policy"}),
    ],
)
def test_heavy_libraries_stay_behind_their_edges(forbidden, allowed_units):
    offending = [
        f"{module_name(path)}:{line}"
        for path in PACKAGE.rglob("*.py")
        for target, line in imports(path)
        if target.split(".")[0] == forbidden and unit(module_name(path)) not in allowed_units
    ]
    assert not offending, f"{forbidden} imported outside {sorted(allowed_units)}: {offending}"


def test_pure_statistics_import_no_framework():
    offending = [
        f"{module_name(path)}:{line} imports {target}"
        for name in PURE_STATISTICS
        for path in (PACKAGE / name).rglob("*.py")
        for target, line in imports(path)
        if target.split(".")[0] in ("torch", "mlflow", "hydra", "omegaconf")
    ]
    assert not offending, offending


def test_the_negative_control_upward_and_same_layer_imports_are_caught():
    """The check must see a violation when there is one."""
    edges = graph()
    edges["vlaeval.seqtest.sequential"] = edges["vlaeval.seqtest.sequential"] | {("vlaeval.jobs.gauntlet", 7)}
    edges["vlaeval.envs.episodes"] = edges["vlaeval.envs.episodes"] | {("vlaeval.tracking", 9)}
    assert upward_imports(edges) == [
        "vlaeval.envs.episodes:9 imports vlaeval.tracking",
        "vlaeval.seqtest.sequential:7 imports vlaeval.jobs.gauntlet",
    ]
    # The cycle this check was written after: the exact test's factory importing the group-sequential
    # test lazily, inside a function, while that module builds on the exact test's machinery.
    edges = graph()
    edges["vlaeval.seqtest.sequential"] = edges["vlaeval.seqtest.sequential"] | {
        ("vlaeval.seqtest.group_sequential", 545)
    }
    assert import_cycles(edges) == [
        "vlaeval.seqtest.group_sequential -> vlaeval.seqtest.sequential -> vlaeval.seqtest.group_sequential"
    ]


def private_uses(path: Path) -> Iterator[Tuple[str, int]]:
    """`module._name` for every private name one module takes from another vlaeval module: by
    `from vlaeval.x import _name` or by attribute on an imported vlaeval module."""
    tree = ast.parse(path.read_text())
    modules: Dict[str, str] = {}  # local name -> imported vlaeval module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vlaeval"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"{node.module}.{alias.name}", node.lineno
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vlaeval") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield f"{modules[node.value.id]}.{node.attr}", node.lineno


def test_no_module_uses_another_modules_private_name():
    """A leading underscore means "only this module relies on it": another module that needs it
    gets a public name (and a docstring), so a refactor of the owner cannot break it unseen."""
    offenders = [
        f"{path.relative_to(REPO)}:{line} uses {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, line in private_uses(path)
    ]
    assert offenders == []


def test_the_negative_control_private_names_are_caught(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from vlaeval.components import _hidden\nfrom vlaeval import console as c\nc._style\n")
    assert sorted(name for name, _ in private_uses(sample)) == ["vlaeval.components._hidden", "vlaeval.console._style"]


def test_the_code_health_ceilings_hold_and_a_rise_is_caught(tmp_path):
    """`make lint` runs scripts/code_health.py --check: this tree is within its ceilings, and a tree
    with one more dict-returning function, or a function longer than the ceiling, is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_health", REPO / "scripts" / "code_health.py")
    health = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(health)
    assert health.check(REPO) == 0
    figures = health.ceiling_figures(REPO)
    (tmp_path / "vlaeval").mkdir()
    extra = "from typing import Any, Dict\n\n" + "".join(
        f"def f{i}() -> Dict[str, Any]:\n    return {{}}\n\n"
        for i in range(health.CEILINGS["functions returning Dict[str, Any] besides serialisers"] + 1)
    )
    (tmp_path / "vlaeval" / "grown.py").write_text(extra)
    assert health.check(tmp_path) == 1
    (tmp_path / "vlaeval" / "grown.py").write_text("def long():\n" + "    x = 1\n" * 95)
    assert health.ceiling_figures(tmp_path)["lines in the longest function"] == 96 and health.check(tmp_path) == 1
    assert figures["lines in the longest function"] <= 89
