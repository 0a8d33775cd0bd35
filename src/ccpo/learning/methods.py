"""The registry of learning methods: every name that ``ccpo train --method``, the rows of
``compare`` / ``evaluate``, the Python API and ``load_policy`` accept, written once.

A method is one of two kinds:

- ``score``: membership scores fitted on replayed traces (:mod:`ccpo.learning.stopping`:
  CStop, the fixed rules ``depth-k`` / ``agree-k``, and ``auto``, which picks among them);
- ``rl``: a π trained by :func:`ccpo.learning.trainers.train` (``ccpo``, or ``cpo`` scored
  three ways: the greedy point policy, split-conformal κ̂, or the online κ tracker).

``ccpo-lam<λ>`` (e.g. ``ccpo-lam0.5``) is CCPO with the set-size price λ
(:func:`resolve_method`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ccpo.errors import CCPOError
from ccpo.learning.stopping import SCORE_METHODS

Kind = Literal["score", "rl"]
Scoring = Literal["batch", "point", "online"]


@dataclass(frozen=True)
class MethodSpec:
    """One learning method: what fits it and how its π is scored."""

    name: str
    kind: Kind
    help: str  # one line for --help and error messages
    trainer: Literal["ccpo", "cpo"] | None = None  # rl: TrainConfig.method
    scoring: Scoring = "batch"  # rl: greedy "point", split-conformal "batch", "online" κ
    compare: bool = True  # a row of `compare` / `evaluate --policy all` with trained rows


_SPECS = (
    MethodSpec(
        "auto",
        "score",
        "cross-fits cstop, cstop-lr, depth-k, agree-k and ccpo (300 steps a fold), keeps the "
        "least validation calibrated cost",
    ),
    MethodSpec("cstop", "score", "CStop: gradient-boosted continuation score, conformal κ̂"),
    MethodSpec("cstop-lr", "score", "CStop with a logistic-regression score", compare=False),
    MethodSpec("depth-k", "score", "run the least k rounds that reach 1 − α", compare=False),
    MethodSpec("agree-k", "score", "stop when the guide agrees, at most k rounds", compare=False),
    MethodSpec("cpo", "rl", "CPO π, greedy point policy (no set)", "cpo", "point"),
    MethodSpec("cpo-batch", "rl", "CPO π, then split-conformal κ̂", "cpo", "batch"),
    MethodSpec("cpo-online", "rl", "CPO π with the online κ tracker", "cpo", "online"),
    MethodSpec("ccpo", "rl", "CCPO, the paper's Algorithm 1", "ccpo"),
)
METHODS: dict[str, MethodSpec] = {s.name: s for s in _SPECS}
# the score entries are exactly what ccpo.learning.stopping fits
assert {s.name for s in _SPECS if s.kind == "score"} == {"auto", *SCORE_METHODS}

_LAM = re.compile(r"^ccpo-lam(?P<lam>[0-9.eE+-]+)$")


def variant_name(method: str, lam: float = 0.0) -> str:
    """The name a trained policy carries and its row is shown under: the method (``ccpo``,
    ``cpo``, ``cpo-batch``, …), or ``ccpo-lam<λ>`` for CCPO with a set-size price λ > 0."""
    return f"{method}-lam{lam:g}" if lam and method == "ccpo" else method


def method_names() -> str:
    """``auto, cstop, …, cpo-online`` (for messages)."""
    return ", ".join(METHODS)


def method_help() -> str:
    """One paragraph naming every method and what it does (for ``--method`` help)."""
    return "; ".join(f"{s.name}: {s.help}" for s in _SPECS) + "; ccpo-lam<λ>: CCPO with λ."


def resolve_method(name: str) -> tuple[MethodSpec, float] | None:
    """(spec, λ) of a method name, ``ccpo-lam<λ>`` included; ``None`` when it names no method
    (it may still name a baseline row or a policy folder)."""
    if name in METHODS:
        return METHODS[name], 0.0
    m = _LAM.match(name)
    if m is None:
        return None
    try:
        lam = float(m.group("lam"))
    except ValueError:
        raise CCPOError(f"cannot read λ in '{name}' (try ccpo-lam0.5)") from None
    if lam < 0:
        raise CCPOError(f"λ must be >= 0 in '{name}'")
    return METHODS["ccpo"], lam


def compare_rows() -> list[str]:
    """The method rows of ``compare``: the RL variants, the fitted score methods, and ``auto``
    last (the product's own pick closes the list)."""
    rows = [s.name for kind in ("rl", "score") for s in _SPECS if s.kind == kind and s.compare]
    return [r for r in rows if r != "auto"] + ["auto"]
