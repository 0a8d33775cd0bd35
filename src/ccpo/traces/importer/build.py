"""One question's rows → one ``ccpo.trace/v1`` trace (:func:`build_trace`).

Each round's verdict is ``yes`` iff the guide's answer equals the base's under the task's
normaliser (an ``agree`` ladder); a step that repeats an earlier step's model is stored as
``reused`` with zero usage (paid once, where first asked); the signals come from the row's
``confidence`` or ``logprob``. The gold is the ``gold`` cells or the answers marked correct,
unless the rows are labelled by agreement with a reference model (:func:`agreement_labels`;
the contract is :mod:`ccpo.traces.labels`). A verify step's verdict is the verified row's
``verdict`` columns, or simulated on request (:mod:`ccpo.traces.verify`).
:func:`with_text_signals` adds a ladder's pure signals (``traces import --signals``;
:func:`import_signals`).
"""

from __future__ import annotations

from typing import Any

from ccpo.errors import CCPOError
from ccpo.traces.accept import AcceptRule
from ccpo.traces.answers import BUILTIN_TASKS, exact_match, normalizer_for
from ccpo.traces.importer.rows import ImportRow, Located
from ccpo.traces.labels import GOLD, reference_model
from ccpo.traces.ladder import Ladder, agree_signals, transfer_signal
from ccpo.traces.schema import (
    SCHEMA_VERSION,
    BaseStep,
    GuideStep,
    Round,
    RoundSignals,
    Trace,
    Usage,
)
from ccpo.traces.signals import CALLED_SIGNALS, compared, normalize_signals, text_signals
from ccpo.traces.verify import SIMULATED_KEY, simulated_record, simulated_usage, simulated_verdict

NO_GOLD = "<no gold: no model answered correctly>"


def _gold(rows: dict[str, Located], norm: Any) -> list[str]:
    """The question's gold: the ``gold`` cells, else the distinct answers marked correct."""
    golds = [loc.row.gold for loc in rows.values() if loc.row.gold]
    if not golds:
        golds = [loc.row.answer for loc in rows.values() if loc.row.correct and loc.row.answer]
    seen: dict[str, str] = {}
    for g in golds:
        seen.setdefault(norm(g), g)
    return list(seen.values()) or [NO_GOLD]


def _usage(row: ImportRow) -> Usage:
    return Usage(input_tokens=row.input_tokens, output_tokens=row.output_tokens)


def _verdict(row: Any, reply: dict[str, Any], verifier: str, simulate: float | None) -> dict:
    """A verify step's guide: ``verifier``'s verdict on the ``reply`` step (its answer and
    label), from the verified ``row``'s verdict columns, or simulated (``simulate``: the
    verifier's accuracy; :func:`~ccpo.traces.verify.simulated_verdict`)."""
    if simulate is not None:
        said = simulated_verdict(row.question_id, row.model, reply["correct"], simulate)
        n_in, n_out = simulated_usage(row.input_tokens, row.output_tokens)
        u = None
    else:
        said, n_in, n_out = row.verdict, row.verdict_input_tokens, row.verdict_output_tokens
        u = None if row.verdict_confidence is None else round(1.0 - row.verdict_confidence, 9)
    return {
        "model": verifier,
        "answer": reply["answer"],
        "correct": reply["correct"],
        "usage": Usage(input_tokens=n_in, output_tokens=n_out),
        "verdict": said,
        "uncertainty": u,
        **({"score": reply["score"]} if "score" in reply else {}),
    }


def _steps(
    rows: dict[str, Located], ladder: Ladder, simulate: float | None = None
) -> dict[tuple[int, str], dict[str, Any]]:
    """Every step of one question's ladder as schema fields: a model's row, or for a step that
    repeats an earlier call, that step's answer and signals (:func:`transfer_signal`) with
    zero usage: paid once, where first asked; a verify step's verifier, its verdict
    (:func:`_verdict`)."""
    steps: dict[tuple[int, str], dict[str, Any]] = {}
    for t, lr in enumerate(ladder.rounds, start=1):
        for role in ("base", "guide"):
            spec = lr.step(role)
            src = ladder.reused(t, role)
            if lr.verifies and role == "guide":
                reply = steps[(t, "base")]
                step = _verdict(rows[lr.base.model].row, reply, spec.model, simulate)
                steps[(t, role)] = {**step, "prompt": spec.prompt}
                continue
            if src is not None:
                orig = steps[src]
                key = "logprob_mean" if src[1] == "base" else "uncertainty"
                sig = transfer_signal(orig[key], src[1], role)
                step = {
                    "model": spec.model,
                    "answer": orig["answer"],
                    "reasoning": orig.get("reasoning", ""),
                    "correct": orig["correct"],
                    "usage": Usage(input_tokens=0, output_tokens=0),
                    "reused": True,
                }
                if "score" in orig:
                    step["score"] = orig["score"]
            else:
                row = rows[spec.model].row
                lp, u = agree_signals(row.probability())
                sig = lp if role == "base" else u
                step = {
                    "model": spec.model,
                    "answer": row.answer,
                    "reasoning": row.reasoning,
                    "correct": row.correct,
                    "usage": _usage(row),
                }
                if row.score is not None:  # the table's own score, kept beside its label
                    step["score"] = row.score
            step["prompt"] = spec.prompt
            if role == "base":
                step.update(logprob_mean=sig, logprob_min=sig)
            else:
                step.pop("reasoning")
                step["uncertainty"] = sig
            steps[(t, role)] = step
    return steps


def _rounds(rows: dict[str, Located], ladder: Ladder, simulate: float | None) -> list[Round]:
    """One question's rounds: verdict ``yes`` iff the guide's answer is the base's (a verify
    step's: its verifier's)."""
    steps = _steps(rows, ladder, simulate)
    out = []
    for t in range(1, ladder.T + 1):
        b, g = steps[(t, "base")], steps[(t, "guide")]
        mode = ladder.round(t).verdict
        if mode != "verify":
            agree = exact_match(g["answer"], [b["answer"]], ladder.task, ladder.family)
            g = {**g, "verdict": "yes" if agree else "no"}
        out.append(Round(round=t, verdict_mode=mode, base=BaseStep(**b), guide=GuideStep(**g)))
    return out


def _labelled(rows: dict[str, Located], correct) -> dict[str, Located]:
    """The rows of one question, each with ``correct(model, located)`` as its label."""
    return {
        m: Located(loc.row.model_copy(update={"correct": correct(m, loc)}), loc.line)
        for m, loc in rows.items()
    }


def agreement_labels(
    rows: dict[str, Located], reference: str, task: str, family: str | None = None
) -> dict[str, Located] | None:
    """The rows of one question labelled by agreement with ``reference``'s answer (correct iff
    equal under the task family's normaliser; the reference's own answer is correct); None
    when the reference's answer is empty after normalisation (nothing to agree with)."""
    ref = rows[reference].row.answer
    if not normalizer_for(task, family)(ref):
        return None
    return _labelled(
        rows, lambda m, loc: m == reference or exact_match(loc.row.answer, [ref], task, family)
    )


def gold_labels(
    rows: dict[str, Located], task: str, family: str | None = None
) -> dict[str, Located] | None:
    """The rows of one question labelled by its ``gold`` cells (correct iff the answer equals
    one of them under the task family's normaliser); None when no row of the question has a
    gold (nothing to label by)."""
    golds = [loc.row.gold for loc in rows.values() if loc.row.gold]
    if not golds:
        return None
    return _labelled(rows, lambda m, loc: exact_match(loc.row.answer, golds, task, family))


def score_labels(
    rows: dict[str, Located], rule: AcceptRule, reference: str | None = None
) -> dict[str, Located] | None:
    """The rows of one question labelled by their own ``score`` and ``rule`` (a relative rule
    compares with ``reference``'s score); None when a score it needs is missing (the question
    is left out, never guessed)."""
    if any(loc.row.score is None for loc in rows.values()):
        return None
    ref = rows[reference].row.score if rule.relative and reference is not None else None
    return _labelled(rows, lambda m, loc: rule.accepts(loc.row.score, ref))


def build_trace(
    rows: dict[str, Located],
    ladder: Ladder,
    source: str,
    labels: str = GOLD,
    simulate: float | None = None,
) -> Trace:
    """One question's trace, its rounds as ``ladder`` plans them (an ``agree`` ladder, with
    its verify steps). ``labels``: ``"gold"`` (the rows' ``correct``), ``"reference:<model>"``
    (rows already labelled by :func:`agreement_labels`; the gold is the reference's answer)
    or ``"scored:…"`` (rows labelled by :func:`score_labels`; the gold is the accepted
    answers). ``simulate``: the verify steps' verdicts are simulated at this accuracy (and
    ``meta.simulated_verifier`` says so), else read from the rows' verdict columns."""
    norm = normalizer_for(ladder.task, ladder.family)
    first = next(iter(rows.values()))
    ref = reference_model(labels)
    gold = [rows[ref].row.answer] if ref is not None else _gold(rows, norm)
    meta: dict[str, Any] = {
        "source": f"imported from {source} by ccpo traces import",
        "collected_at": "unknown (imported table)",
        "imported": True,
    }
    if labels != GOLD:
        meta["labels"] = labels
    if ref is None and gold == [NO_GOLD]:
        meta["gold_unknown"] = True
    verifiers = {r.guide.model for r in ladder.rounds if r.verifies}
    if simulate is not None and verifiers:
        meta[SIMULATED_KEY] = simulated_record(verifiers.pop(), simulate)
    task = ladder.task
    return Trace(
        schema=SCHEMA_VERSION,
        id=first.row.question_id,
        task=task,
        family=None if task.lower() in BUILTIN_TASKS else ladder.family,
        question=first.row.question,
        messages=first.row.messages,
        gold=gold,
        rounds=_rounds(rows, ladder, simulate),
        meta=meta,
    )


def import_signals(names: list[str]) -> tuple[str, ...]:
    """The ladder signals an import can record (``--signals``), in canonical order: the pure
    ones (``similarity``, ``length``, ``refusal``, ``logprob``); a signal that needs a call
    per round is refused, saying what to do."""
    signals = normalize_signals(names, "-", "--signals")
    called = [s for s in signals if s in CALLED_SIGNALS]
    if called:
        raise CCPOError(
            f"--signals {', '.join(called)}: needs a call per round, which an import does not "
            "make; import with the pure signals (similarity, length, refusal, logprob) or "
            "collect with the ladder's signals"
        )
    return signals


def with_text_signals(tr: Trace, signals: tuple[str, ...]) -> Trace:
    """``tr`` recording the ladder ``signals`` (checked by :func:`import_signals`), each
    round with its :func:`~ccpo.traces.signals.text_signals` computed from the table's
    answers (a one-model step's against the step before it:
    :func:`~ccpo.traces.signals.compared`). An empty ``signals`` returns ``tr`` unchanged."""
    if not signals:
        return tr
    rounds = [
        r.model_copy(
            update={
                "signals": RoundSignals(**text_signals(*(s.answer for s in compared(tr.rounds, i))))
            }
        )
        for i, r in enumerate(tr.rounds)
    ]
    return tr.model_copy(update={"signals": list(import_signals(list(signals))), "rounds": rounds})
