"""Every requirement in pyproject.toml has an upper bound.

A fresh install resolves the newest versions a requirement allows: typer 0.29 (its own
click) once turned every usage error into a traceback while the tests stayed green, and a
new ruff minor adds lint rules that fail CI's ``ruff check``. A bound lets a new major (a
new minor below 1.0) in only after the tests have run on it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# a requirement's name, its extras, and the version clauses before any marker
_REQ = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*(\[[^\]]*\])?\s*([^;]*)")


def _requirements() -> list[tuple[str, str]]:
    meta = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    reqs = [("dependencies", r) for r in meta["dependencies"]]
    for extra, rs in meta["optional-dependencies"].items():
        reqs += [(extra, r) for r in rs]
    return reqs


def _upper_bound(clauses: str) -> bool:
    """``clauses`` (``>=1.2,<2``) cap the version: a ``<``, ``<=``, ``==`` or ``~=`` clause."""
    return any(re.match(r"\s*(<|<=|==|~=)\s*\d", c) for c in clauses.split(","))


def test_every_requirement_has_an_upper_bound():
    reqs = _requirements()
    assert len(reqs) > 20  # the parse found them (core, serve, train, otel, postgres, dev)
    unbounded = []
    for where, req in reqs:
        m = _REQ.match(req)
        assert m is not None, req
        name, _, clauses = m.groups()
        if where == "dev" and name == "ccpo":  # the project's own extras, bounded above
            continue
        if not _upper_bound(clauses):
            unbounded.append(f"{where}: {req}")
    assert not unbounded, "requirements without an upper bound:\n" + "\n".join(unbounded)


def test_the_check_sees_a_missing_bound():
    assert not _upper_bound(">=0.110")
    assert not _upper_bound("")
    assert _upper_bound(">=0.110,<0.166")
    assert _upper_bound("==2.13.0")
