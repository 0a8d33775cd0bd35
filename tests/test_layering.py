"""The package's arrows point inward: the trace side, the learning side and the policies never
import the LLM side, the product or the runtime; a policy loads and decides without the
trainer; no module imports itself through any chain of imports (no cycle of any length).

Imports are read from the source with :mod:`ast`, every one of them: at module level, inside
functions and under ``if TYPE_CHECKING:`` alike.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import ccpo

PACKAGE = Path(ccpo.__file__).parent
INNER = ("ccpo.traces", "ccpo.learning", "ccpo.policies")
OUTER = (
    "ccpo.llm",
    "ccpo.product",
    "ccpo.runtime",
    "ccpo.cli",
    "ccpo.evaluation",
    "ccpo.report",
    "ccpo.api",
)
#: a policy (and what it is made of) loads and decides without the trainer; the registry
#: imports it only inside the fitter of auto's CCPO candidate
ARTIFACT = (
    "ccpo.policies.base",
    "ccpo.policies.sets",
    "ccpo.policies.rl",
    "ccpo.policies.cstop",
    "ccpo.policies.rules",
    "ccpo.policies.single",
    "ccpo.policies.classifier",
    "ccpo.policies.folder",
    "ccpo.policies.provenance",
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
    """Each ``ccpo`` module → the ``ccpo`` modules it imports (a fresh copy of one parse of the
    sources per test process)."""
    return {name: set(deps) for name, deps in _parsed().items()}


@functools.cache
def _parsed() -> dict[str, frozenset[str]]:
    known = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: frozenset(m for m in imported_modules(path) if m in known)
        for name, path in known.items()
    }


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


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's
    algorithm, iterative): each is a set of modules that import each other through some
    chain. A package's ``__init__`` importing its own submodules is an edge like any other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_long_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "e": {"a"}, "f": {"f"}}
    assert import_cycles(graph) == [["a", "b", "c", "d"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_of_any_length() -> None:
    graph = {n: {m for m in deps if m != n} for n, deps in modules().items()}
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


#: the serve state store's parts, below the store that composes them: each is an object the
#: store makes (money and answers on the commit engine), none reaches back up to the store, and
#: the engine knows money and answers only through the protocols it declares
STATE = "ccpo.runtime.state"
STATE_BELOW = {
    "store": {"answers", "money", "engine", "schema", "batch", "db", "backends"},
    "money": {"engine", "schema", "batch", "process"},
    "answers": {"engine", "batch", "db"},
    "engine": {"schema", "batch", "db"},
    "schema": {"db"},
    "batch": {"db"},
}


@pytest.mark.parametrize("part", sorted(STATE_BELOW))
def test_the_state_stores_parts_import_only_what_is_below_them(part: str) -> None:
    graph = modules()
    name = f"{STATE}.{part}"
    assert name in graph
    mine = {m.removeprefix(STATE + ".") for m in graph[name] if m.startswith(STATE + ".")}
    above = sorted(mine - STATE_BELOW[part])
    assert not above, f"{name} imports {above} (allowed: {sorted(STATE_BELOW[part])})"
