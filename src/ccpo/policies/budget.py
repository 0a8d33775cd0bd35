"""A latency budget: the policy's mean estimated seconds per question must stay within it.

The estimate is :mod:`ccpo.traces.latency`'s (output tokens at a stated speed, an ``agree``
round's calls at once). "Within" is in expectation: a mean over questions, not a bound per
question. ``auto`` uses the budget to choose (a candidate whose validation latency exceeds it
is not eligible; the cheapest eligible one wins, ties to the earlier); a named method has no
choice to make, so its calibrated policy is refused when its calibration mean exceeds the
budget. A calibrated threshold is never moved to meet a budget: the coverage guarantee comes
first (docs/decisions.md, "A latency budget refuses, it never moves a threshold").

Main names: :func:`eligible`, :func:`pick`, :func:`check_budget`, :func:`budget_line`,
:class:`OverBudget`. Docs: docs/cli.md, "train"; docs/glossary.md, "latency budget".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ccpo.errors import CCPOError

#: the key of a candidate's validation latency (seconds per question) in ``auto``'s figures
LATENCY = "latency_s_per_question"
#: the key of a candidate's validation cost in ``auto``'s figures
COST = "cost_cents_per_question"


class OverBudget(CCPOError):
    """No policy these traces allow meets the latency budget: a larger budget is needed."""


def check_budget_value(budget: float | None) -> None:
    """``--latency-budget``: a finite number of seconds > 0 (a usage error otherwise)."""
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise CCPOError(f"--latency-budget must be a number of seconds > 0, got {budget:g}")


def within(latency: float, budget: float | None) -> bool:
    """``latency`` (seconds per question) meets ``budget`` (None: no budget); an unknown
    (nan) latency meets none."""
    return budget is None or (not math.isnan(latency) and latency <= budget)


def eligible(figures: Mapping[str, Mapping[str, float]], budget: float | None) -> list[str]:
    """The candidates of ``figures`` (name → its figures, :data:`LATENCY` among them) whose
    validation latency is within ``budget``, in order; every candidate without a budget."""
    return [n for n, f in figures.items() if within(f.get(LATENCY, math.nan), budget)]


def pick(figures: Mapping[str, Mapping[str, float]], budget: float | None = None) -> str:
    """The eligible candidate of least validation cost (:data:`COST`), ties to the earlier;
    :class:`OverBudget` when none is eligible, naming the least latency reached and by whom."""
    ok = eligible(figures, budget)
    if not ok:
        known = {
            n: f[LATENCY] for n, f in figures.items() if not math.isnan(f.get(LATENCY, math.nan))
        }
        if not known:
            raise OverBudget(
                "these traces give no latency estimate, so no candidate can be held to "
                "--latency-budget; drop --latency-budget"
            )
        best = min(known, key=known.__getitem__)
        assert budget is not None  # every candidate is eligible without a budget
        raise OverBudget(
            f"no candidate meets --latency-budget {seconds(budget)} s: the least validation "
            f"latency is {known[best]:.2f} s per question ({best}); use a larger "
            f"--latency-budget (at least {math.ceil(known[best] * 100) / 100:g})"
        )
    return min(ok, key=lambda n: figures[n][COST])


def check_budget(latency: float, budget: float | None, variant: str, auto: bool = False) -> None:
    """A calibrated policy's mean latency on its calibration questions against ``budget``:
    :class:`OverBudget` with both numbers when it exceeds it (the threshold is not moved).
    ``auto``: the policy is ``auto``'s pick, eligible on its validation questions."""
    if within(latency, budget):
        return
    assert budget is not None
    how = (
        "auto chose it within the budget on the training questions; use a larger --latency-budget"
        if auto
        else "use a larger --latency-budget, or --method auto, which keeps the cheapest "
        "candidate within it"
    )
    raise OverBudget(
        f"{variant} takes {latency:.2f} s per question on the calibration questions "
        f"(estimated), over --latency-budget {seconds(budget)} s; nothing written. Its "
        f"calibrated threshold is not moved to meet a budget (the coverage guarantee comes "
        f"first): {how}"
    )


def seconds(x: float) -> str:
    """``3.2``, ``4.0``, ``1.138``: seconds as given (one decimal at least), for messages."""
    text = f"{x:g}"
    return text if any(c in text for c in ".en") else text + ".0"


def budget_line(latency: float, budget: float) -> str:
    """ "latency 3.2 s per question (budget 4.0 s): holds" (or "exceeds")."""
    verdict = "holds" if within(latency, budget) else "exceeds"
    return f"latency {latency:.2f} s per question (budget {seconds(budget)} s): {verdict}"
