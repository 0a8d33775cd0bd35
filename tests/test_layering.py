"""The package's arrows point inward: the trace side and the learning side never import the
LLM side, the product or the runtime; the policy artifact never imports the trainer; no two
modules import each other.

Imports are read from the source with :mod:`ast`, every one of them: at module level, inside
functions and under ``if TYPE_CHECKING:`` alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ccpo

PACKAGE = Path(ccpo.__file__).parent
INNER = ("ccpo.traces", "ccpo.learning")
OUTER = (
    "ccpo.llm",
    "ccpo.product",
    "ccpo.runtime",
    "ccpo.cli",
    "ccpo.evaluation",
    "ccpo.report",
    "ccpo.api",
)
#: the artifact (and what it is made of) loads and decides without the trainer
ARTIFACT = (
    "ccpo.learning.policy",
    "ccpo.learning.artifact",
    "ccpo.learning.weights",
    "ccpo.learning.mlp",
    "ccpo.learning.heads",
)


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Every ``ccpo`` module ``path`` (below ``root``) imports: ``from a import b`` names
    ``a`` and ``a.b``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m == "ccpo" or m.startswith("ccpo.")}


def modules() -> dict[str, set[str]]:
    known = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imported_modules(path) if m in known} for name, path in known.items()}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_walker_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "ccpo" / "traces"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import ccpo.llm.client\n"
        "from ccpo.product import cli\n"
        "from ..runtime.agent import ConformalAgent\n"
        "if TYPE_CHECKING:\n    from ccpo.learning.trainers import TrainResult\n"
        "def f():\n    from . import io\n    return io\n"
    )
    found = imported_modules(src, tmp_path)
    assert {
        "ccpo.llm.client",
        "ccpo.product.cli",
        "ccpo.runtime.agent",
        "ccpo.learning.trainers",
        "ccpo.traces.io",
    } <= found


def test_inner_sides_never_import_the_outer_ones() -> None:
    graph = modules()
    inner = [n for n in graph if within(n, INNER)]
    assert len(inner) > 15, "the walk found too few trace/learning modules"
    bad = sorted(f"{n} imports {m}" for n in inner for m in graph[n] if within(m, OUTER))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ARTIFACT)
def test_the_artifact_never_imports_the_trainer(name: str) -> None:
    graph = modules()
    assert name in graph
    assert "ccpo.learning.trainers" not in graph[name]


def test_no_two_modules_import_each_other() -> None:
    graph = modules()
    pairs = sorted(
        f"{a} <-> {b}"
        for a, deps in graph.items()
        for b in deps
        if a < b and a in graph.get(b, set()) and not (a == "ccpo" or b == "ccpo")
    )
    assert not pairs, "\n".join(pairs)
