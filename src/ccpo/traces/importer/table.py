"""The import itself: :func:`open_table` reads and checks a table (streamed into a
:class:`~ccpo.traces.importer.spill.Spill`), plans its cascade and its labels and returns a
:class:`TableImport`, whose :meth:`~TableImport.traces` builds the traces one question at a
time; :func:`import_table` is the same, returned in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.traces.accept import AcceptRule
from ccpo.traces.answers import family_of
from ccpo.traces.importer.build import (
    agreement_labels,
    build_trace,
    gold_labels,
    score_labels,
)
from ccpo.traces.importer.cascade import Cascade, plan_cascade, with_verifier
from ccpo.traces.importer.rows import VERDICT_COLUMNS, Located, table_error, validated_rows
from ccpo.traces.importer.spill import Spill
from ccpo.traces.labels import GOLD, reference_labels, reference_model, scored_labels
from ccpo.traces.ladder import Ladder
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import Trace


@dataclass
class TableImport:
    """An import table read and checked (:func:`open_table`); :meth:`traces` builds its traces
    one question at a time. Close it (or use it as a context manager) to drop its temporary
    file."""

    path: Path
    task: str
    family: str | None
    cascade: Cascade
    questions: int
    labels: str  # "gold", "reference:<model>" or "scored:…"
    reference_named: bool  # the reference was named (else: the most expensive model)
    replaced: bool  # the table's correct/gold labels are replaced by agreement or scores
    _spill: Spill
    dropped: list[str] = field(default_factory=list)  # ids without a reference answer
    rule: AcceptRule | None = None  # labels from the rows' scores (--accept)
    score_reference: str | None = None  # the model a relative rule compares with
    unscored: list[str] = field(default_factory=list)  # ids with a missing score
    #: the verify steps' verdicts are simulated at this accuracy (None: the table's own)
    simulate: float | None = None
    #: labelled by the ``gold`` cells (a table with gold answers and no ``correct`` column)
    from_gold: bool = False

    @property
    def reference(self) -> str | None:
        return reference_model(self.labels)

    def ladder(self) -> Ladder:
        return self.cascade.ladder(self.task, self.family)

    def traces(self) -> Iterator[Trace]:
        """The traces, in the table's question order; questions without a reference answer
        are skipped and listed in :attr:`dropped`. Refused when none is left."""
        ladder = self.ladder()
        ref = self.reference
        self.dropped, self.unscored = [], []
        n = 0
        for rows in self._spill.groups():
            if self.rule is not None:
                scored = score_labels(rows, self.rule, self.score_reference)
                if scored is None:
                    self.unscored.append(next(iter(rows.values())).row.question_id)
                    continue
                rows = scored
            elif self.from_gold:
                labelled = gold_labels(rows, ladder.task, ladder.family)
                if labelled is None:
                    self.dropped.append(next(iter(rows.values())).row.question_id)
                    continue
                rows = labelled
            elif ref is not None:
                labelled = agreement_labels(rows, ref, ladder.task, ladder.family)
                if labelled is None:
                    self.dropped.append(next(iter(rows.values())).row.question_id)
                    continue
                rows = labelled
            n += 1
            yield build_trace(rows, ladder, self.path.name, self.labels, self.simulate)
        if n == 0 and self.rule is not None:
            raise CCPOError(f"{self.path}: every question lacks a model's score: nothing to label")
        if n == 0 and self.from_gold:
            raise CCPOError(f"{self.path}: no question has a gold answer: nothing to label by")
        if n == 0:
            raise CCPOError(
                f"{self.path}: the reference model '{ref}' answered none of the "
                f"{self.questions} questions: nothing to agree with (name another with "
                "--reference)"
            )

    def close(self) -> None:
        self._spill.close()

    def __enter__(self) -> TableImport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_table(
    path: str | Path,
    task: str,
    prices: PriceTable,
    guide: str | None = None,
    family: str | None = None,
    reference: str | None = None,
    accept: AcceptRule | None = None,
    steps: str | None = None,
    verifier: str | None = None,
    verify_after: list[str] | None = None,
    simulate: float | None = None,
) -> TableImport:
    """Read and check ``path`` (streamed into a temporary file), plan its cascade and its
    labels (docs/import.md): the ``correct`` column, else the ``gold`` cells (under the task
    family's normaliser), else agreement with a reference model, or with ``accept`` the rows'
    ``score`` by that rule; ``reference`` replaces ``correct`` and ``gold``. ``steps``:
    ``"one"`` (a model per round) or ``"pair"``; by default one-model steps, pairs with
    ``guide`` (:func:`default_steps`).
    ``verifier``: a verify step by this model after each step but the last (or after the
    models of ``verify_after``), its verdicts the table's verdict columns, or with
    ``simulate`` (an accuracy) simulated (:mod:`ccpo.traces.verify`). Raises
    :class:`~ccpo.errors.UnknownModelPriceError` for a model without a price and a one-line
    :class:`CCPOError` for any other problem."""
    try:
        family_of(task, family)
    except ValueError as e:
        raise CCPOError(f"--family: {e}") from None
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: no such file")
    spill = Spill(p)
    try:
        has_correct = has_gold = has_score = False
        verdicts = _Verdicts()
        n = 0
        verbatim = family_of(task, family) == "chat"  # a reply is kept as written
        for loc, has_correct in validated_rows(p, verbatim):
            n += 1
            has_score |= loc.row.score is not None
            if has_correct and reference is None and accept is None and loc.row.correct is None:
                raise table_error(
                    p,
                    loc.line,
                    "correct",
                    "missing or empty; every row needs it (or label by agreement: "
                    "--reference MODEL)",
                )
            has_gold |= loc.row.gold is not None
            verdicts.add(loc)
            spill.add(loc)
        if n == 0:
            raise table_error(p, None, None, "holds no rows")
        models = spill.check_complete()
        prices.check(models)
        cost = {m: prices.cost(m, *spill.tokens[m]) / spill.questions for m in models}
        unit = {
            m: prices.price(m).input_usd_per_mtok + prices.price(m).output_usd_per_mtok
            for m in models
        }
        chosen = steps or default_steps(guide)
        cascade = with_verifier(plan_cascade(cost, guide, unit, chosen), verifier, verify_after)
        if cascade.verifier is not None:
            prices.check([cascade.verifier])
            verdicts.check(p, cascade, simulate)
        elif simulate is not None:
            raise CCPOError("--simulate-verifier needs --verifier MODEL (the model it simulates)")
        if reference is not None and reference not in models:
            raise CCPOError(
                f"--reference '{reference}' is not a model of the table ({', '.join(models)})"
            )
        if accept is not None or has_score:
            scored = _scored(p, accept, reference, has_correct, has_score, cascade)
            if scored is not None:
                return TableImport(
                    p, task, family, cascade, spill.questions, scored[0], reference is not None,
                    has_correct or has_gold, spill, rule=accept, score_reference=scored[1],
                    simulate=simulate,
                )  # fmt: skip
        labelled = has_correct and reference is None
        from_gold = not has_correct and has_gold and reference is None
        ref = None if labelled or from_gold else (reference or cascade.order()[-1])
        return TableImport(
            p,
            task,
            family,
            cascade,
            spill.questions,
            GOLD if ref is None else reference_labels(ref),
            reference is not None,
            ref is not None and (has_correct or has_gold),
            spill,
            simulate=simulate,
            from_gold=from_gold,
        )
    except BaseException:
        spill.close()
        raise


@dataclass
class _Verdicts:
    """What a table holds of a verifier's verdicts: whether any row has one, and per model
    the first row without the verdict call's usage."""

    seen: int | None = None  # the first row with a verdict column filled
    missing: dict[str, int] = field(default_factory=dict)

    def add(self, loc: Located) -> None:
        r = loc.row
        vals = [getattr(r, c) for c in VERDICT_COLUMNS]
        if self.seen is None and any(v is not None for v in vals):
            self.seen = loc.line
        if r.verdict_input_tokens is None or r.verdict_output_tokens is None:
            self.missing.setdefault(r.model, loc.line)

    def check(self, p: Path, plan: Cascade, simulate: float | None) -> None:
        """Refuse what would make a verdict up or leave one out: simulation of a table that
        has verdicts, none and no simulation, a verified model's row without the usage."""
        if simulate is not None:
            if not 0.0 <= simulate <= 1.0:
                raise CCPOError(f"--simulate-verifier {simulate:g}: an accuracy in [0, 1]")
            if self.seen is not None:
                raise table_error(
                    p, self.seen, "verdict", "the table records verdicts; drop "
                    "--simulate-verifier (they are used as recorded)",
                )  # fmt: skip
            return
        if self.seen is None:
            raise CCPOError(
                f"{p}: --verifier {plan.verifier}: the table records no verdicts (columns "
                f"{', '.join(VERDICT_COLUMNS)}); add them, or pass --simulate-verifier ACCURACY "
                "to simulate them (the traces and every report then say so)"
            )
        for m in plan.verify_after:
            if m in self.missing:
                raise table_error(
                    p, self.missing[m], "verdict_input_tokens", f"missing; the verify step "
                    f"after {m} needs its verdict call's usage (verdict_input_tokens, "
                    "verdict_output_tokens) on every row of that model",
                )  # fmt: skip


def default_steps(guide: str | None) -> str:
    """The layout an import uses unless ``--steps`` says: one model per step, so the ladder
    can stop after any one call (its cheapest model's reply included), except with
    ``--guide``, which pairs every model with that guide."""
    return "pair" if guide is not None else "one"


def _scored(
    p: Path,
    accept: AcceptRule | None,
    reference: str | None,
    has_correct: bool,
    has_score: bool,
    cascade: Cascade,
) -> tuple[str, str | None] | None:
    """(labels, the model a relative rule compares with) of an import with ``--accept``; None
    when the table's scores are not used (no rule, and ``correct`` or ``--reference`` label
    it). Refuses a score column nobody said how to read, and a rule without scores."""
    if accept is None:
        if has_correct or reference is not None:
            return None
        raise CCPOError(
            f"{p}: the table has a 'score' column but no rule says which scores count as "
            "correct: pass --accept (e.g. --accept 'score>=8' or --accept "
            "'score>=reference-1'), or label by agreement with --reference MODEL"
        )
    if not has_score:
        raise table_error(
            p, None, "score", f"--accept {accept.text!r} needs a 'score' column (a number per row)"
        )
    if reference is not None and not accept.relative:
        raise CCPOError(
            f"--reference {reference}: the rule {accept.text!r} compares each row's score with "
            "a number, not with a reference model; drop --reference, or write a relative rule "
            "(e.g. 'score>=reference-1')"
        )
    ref = (reference or cascade.order()[-1]) if accept.relative else None
    return scored_labels(accept.text, ref), ref


def import_table(
    path: str | Path, task: str, prices: PriceTable, **options: Any
) -> tuple[list[Trace], Cascade]:
    """Read ``path`` and return its traces (in memory) and the cascade they follow (``ccpo
    traces import`` streams them with :func:`open_table`, whose options, ``guide``,
    ``family``, ``reference`` and ``accept``, are taken by name)."""
    with open_table(path, task, prices, **options) as imp:
        return list(imp.traces()), imp.cascade
