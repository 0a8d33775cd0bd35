"""Acceptance rules: when a scored or judged reply counts as correct (``--accept``).

A team's own scores (a ``score`` column of an import table) and an LLM judge's ratings
(``ccpo traces judge``) become labels through one tiny grammar, :func:`parse_rule`:

- ``score OP NUMBER``: e.g. ``score>=8`` (the reply's own score);
- ``score OP reference[±NUMBER]``: e.g. ``score>=reference-1``, against the reference model's
  score on the same question;

with OP one of ``>=``, ``>``, ``<=``, ``<``, ``==``. Anything else is refused with a message
that shows the grammar. :class:`AcceptRule` keeps the canonical text (recorded in
``meta.labels``, :mod:`ccpo.traces.labels`), evaluates a score (:meth:`AcceptRule.accepts`) and
says itself in words (:meth:`AcceptRule.words`). Docs: docs/import.md, "Scores and an
acceptance rule"; the guarantee: docs/theory.md, "Judged acceptance".
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from ccpo.errors import CCPOError

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}
_SHOWN = {">=": "≥", ">": ">", "<=": "≤", "<": "<", "==": "="}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_RULE = re.compile(
    rf"^score(?P<op>>=|<=|==|>|<)(?:(?P<num>-?{_NUMBER})|reference(?:(?P<sign>[+-])(?P<off>{_NUMBER}))?)$"
)
GRAMMAR = (
    "score OP NUMBER or score OP reference[+|-NUMBER], OP one of >=, >, <=, <, == "
    '(e.g. "score>=8" or "score>=reference-1")'
)


@dataclass(frozen=True)
class AcceptRule:
    """A parsed acceptance rule: ``score OP value`` or ``score OP reference + value``."""

    op: str
    value: float  # the number, or the offset from the reference's score
    relative: bool  # compared with the reference model's score on the same question

    @property
    def text(self) -> str:
        """The canonical text (no spaces), as recorded in ``meta.labels``."""
        v = f"{self.value:g}"
        if not self.relative:
            return f"score{self.op}{v}"
        if self.value == 0:
            return f"score{self.op}reference"
        return f"score{self.op}reference{'+' if self.value > 0 else ''}{v}"

    def accepts(self, score: float, reference: float | None = None) -> bool:
        """Whether ``score`` meets the rule (``reference``: the reference model's score on the
        same question, needed by a relative rule)."""
        if self.relative:
            if reference is None:
                raise ValueError(f"{self.text} needs the reference model's score")
            return _OPS[self.op](score, reference + self.value)
        return _OPS[self.op](score, self.value)

    @property
    def reference_accepted(self) -> bool:
        """Whether the reference model's own reply always meets the rule (every question then
        has an accepted reply)."""
        return self.relative and self.accepts(0.0, 0.0)

    def words(self, reference: str | None = None, scale: str = "") -> str:
        """The rule in words: "scores ≥ 8", "scores ≥ gpt-4o's score − 1"."""
        shown = _SHOWN[self.op]
        if not self.relative:
            return f"scores {shown} {self.value:g}{scale}"
        whose = f"{reference}'s score" if reference else "the reference's score"
        if self.value == 0:
            return f"scores {shown} {whose}"
        sign = "+" if self.value > 0 else "−"
        return f"scores {shown} {whose} {sign} {abs(self.value):g}"


def parse_rule(text: str, option: str = "--accept") -> AcceptRule:
    """Parse an acceptance rule (the grammar of the module doc); spaces are ignored. Raises a
    one-line :class:`CCPOError` naming ``option`` and the grammar for anything else."""
    m = _RULE.match(re.sub(r"\s+", "", text or "").lower())
    if m is None:
        raise CCPOError(f"{option} {text!r}: not a rule; expected {GRAMMAR}")
    if m.group("num") is not None:
        value, relative = float(m.group("num")), False
    else:
        off = float(m.group("off") or 0)
        value, relative = (-off if m.group("sign") == "-" else off), True
    if not math.isfinite(value):
        raise CCPOError(f"{option} {text!r}: the number must be finite")
    return AcceptRule(m.group("op"), value, relative)
