"""``ccpo traces import``: a table of per-question answers of several models → ``ccpo.trace/v1``.

Many users already hold answers of several models to the same questions (routing logs,
evaluation-harness outputs). This module turns such a table into a trace set without a new
collection, as a **cascade**:

- the models are ordered by their mean cost per question in the table (usage × price; the
  cheapest first, ties by name);
- without a named guide, round t's base is the t-th cheapest model and its guide the next
  stronger one (the (t+1)-th): T = K − 1 rounds for K models;
- with a named guide, that model is the guide of every round and the other models are the
  bases, cheapest first: again T = K − 1;
- the verdict is ``yes`` iff the guide's answer equals the base's under the task's answer
  normaliser (:func:`ccpo.traces.answers.normalizer_for`): an ``agree`` ladder
  (:mod:`ccpo.traces.ladder`), written into every round (``verdict_mode: agree``, each step's
  ``prompt: cot``) so that a policy trained on the traces can be deployed on the same models;
- **paid once**: a model answers a question once in the table, so a step that repeats an
  earlier step's model (round t + 1's base is round t's guide; a named guide in every round)
  is stored as ``reused`` with zero usage: it is charged in the round that first asks it, as
  the deployed agent pays for it (it reuses the answer rather than asking again);
- the task's family (``--family mcq|short|exact``; built-in names have their own) is written
  into each trace (``family``) and picks the normaliser;
- the guide's uncertainty is ``1 − p`` and the base's log-prob score ``log p``, where ``p`` is
  the row's ``confidence``, else ``exp(logprob)``; both are null when the row has neither.

Table format (CSV with a header row, or JSON Lines with one object per row), one row per
(question, model):

=============== ========= =========================================================
column          required  meaning
=============== ========= =========================================================
question_id     yes       the question's id (becomes the trace id)
question        yes       the question text (the same on every row of a question)
model           yes       the model's name (it needs a price: bundled or ``--prices``)
answer          yes       the model's answer (may be empty: no answer, counts as wrong)
correct         yes       ``true``/``false`` (in a CSV also ``1``/``0``, ``yes``/``no``)
input_tokens    yes       the model's input tokens for this question (integer ≥ 0)
output_tokens   yes       the model's output tokens (integer ≥ 0)
logprob         no        mean token log-probability of the answer (≤ 0)
confidence      no        the model's probability that its answer is right, in [0, 1]
gold            no        the reference answer (else: the answers marked correct)
reasoning       no        the model's reasoning text, kept in ``base.reasoning``
=============== ========= =========================================================

A CSV cell is text by nature, so a CSV's ``correct`` may be written ``true``/``1``/``yes`` and
its numbers as digits. A JSONL row is typed JSON and is read strictly: ``correct`` is a JSON
boolean, the token counts JSON integers, ``logprob``/``confidence`` JSON numbers or null,
the text columns JSON strings; ``"correct": "false"`` or ``"input_tokens": 12.0`` is refused.
Lines are read bounded (:func:`ccpo.traces.io.iter_lines`: no line over the cap is held
whole); a ``.gz`` table is read as it is decompressed.

Other columns are ignored. Every problem is a :class:`~ccpo.errors.CCPOError` of one line that
names the file, the row (a CSV's header is row 1, as a spreadsheet shows it; a JSONL row is
its line) and the column.
"""

from __future__ import annotations

import csv
import json
import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ccpo.errors import CCPOError
from ccpo.traces.answers import BUILTIN_TASKS, exact_match, family_of, normalizer_for
from ccpo.traces.io import iter_lines, loads_strict
from ccpo.traces.ladder import Ladder, LadderRound, Step, agree_signals, transfer_signal
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import SCHEMA_VERSION, BaseStep, GuideStep, Round, Trace, Usage

REQUIRED_COLUMNS = (
    "question_id",
    "question",
    "model",
    "answer",
    "correct",
    "input_tokens",
    "output_tokens",
)
OPTIONAL_COLUMNS = ("logprob", "confidence", "gold", "reasoning")
NO_GOLD = "<no gold: no model answered correctly>"
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


class ImportRow(BaseModel):
    """One row of an import table: one model's answer to one question."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    question_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    model: str = Field(min_length=1)
    answer: str = ""
    correct: bool
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    logprob: float | None = Field(None, le=0)
    confidence: float | None = Field(None, ge=0, le=1)
    gold: str | None = None
    reasoning: str = ""

    @field_validator("correct", mode="before")
    @classmethod
    def _parse_bool(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str) and not _typed(info):  # a CSV cell: text by nature
            s = v.strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError(f"expected true or false, found {v!r}")
        return v

    @field_validator("logprob", "confidence", mode="before")
    @classmethod
    def _blank_number_is_none(cls, v: Any, info: ValidationInfo) -> Any:
        blank = isinstance(v, str) and not v.strip() and not _typed(info)
        return None if blank else v

    @field_validator("gold", mode="before")
    @classmethod
    def _blank_is_none(cls, v: Any) -> Any:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("answer", "reasoning", mode="before")
    @classmethod
    def _none_is_blank(cls, v: Any) -> Any:
        return "" if v is None else v

    def probability(self) -> float | None:
        """The row's probability that its answer is right: ``confidence``, else
        ``exp(logprob)``, else None."""
        if self.confidence is not None:
            return self.confidence
        return None if self.logprob is None else math.exp(self.logprob)


def _typed(info: ValidationInfo) -> bool:
    """Whether the row came from a typed (JSON) table, whose values are not text to parse."""
    return bool((info.context or {}).get("typed"))


def _is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    return suffixes[-1:] in ([".jsonl"], [".json"], [".ndjson"])


def _text_lines(path: Path) -> Iterator[str]:
    """The lines of a CSV file, each bounded (:func:`iter_lines`), decoded, BOM dropped."""
    for lineno, raw in iter_lines(path):
        text = raw.decode("utf-8")
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # spreadsheets' BOM
        yield text + "\n"


@dataclass(frozen=True)
class Located:
    """A parsed row and where it came from (its row number, see :func:`_raw_records`)."""

    row: ImportRow
    line: int


@dataclass(frozen=True)
class Cascade:
    """The round plan: ``bases[t]`` and ``guides[t]`` are the models of round t + 1."""

    bases: tuple[str, ...]
    guides: tuple[str, ...]
    cost_per_question: dict[str, float]  # USD, mean over the table's questions

    @property
    def rounds(self) -> int:
        return len(self.bases)

    def ladder(self, task: str, family: str | None = None) -> Ladder:
        """The ``agree`` ladder of the cascade: every model answers the question itself."""
        return Ladder(
            task,
            family_of(task, family),
            tuple(
                LadderRound(Step(b, "cot"), Step(g, "cot"), "agree")
                for b, g in zip(self.bases, self.guides, strict=True)
            ),
        )


def _error(path: Path, line: int | None, column: str | None, msg: str) -> CCPOError:
    where = f"{path}" if line is None else f"{path}: row {line}"
    col = f", column '{column}'" if column else ""
    return CCPOError(f"{where}{col}: {msg}")


def _raw_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row, record)`` of a CSV (header first: row 1, as a spreadsheet numbers rows; a cell
    may span lines) or JSONL (``.jsonl``/``.json``/``.ndjson``: row = line) table."""
    if _is_jsonl(path):
        for line, raw in iter_lines(path):
            if not raw.strip():
                continue
            try:
                obj = loads_strict(raw.decode("utf-8"))
            except json.JSONDecodeError as e:
                raise _error(path, line, None, f"malformed JSON ({e.msg})") from None
            except ValueError as e:  # NaN/Infinity, runaway nesting
                raise _error(path, line, None, f"malformed JSON ({e})") from None
            if not isinstance(obj, dict):
                raise _error(path, line, None, "expected one JSON object per line")
            yield line, obj
        return
    reader = csv.DictReader(_text_lines(path))
    try:
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise _error(
                path, 1, missing[0], f"missing from the header (found: {', '.join(header)})"
            )
        for line, rec in enumerate(reader, start=2):
            if None in rec or any(v is None for v in rec.values()):
                raise _error(path, line, None, f"expected {len(header)} cells like the header")
            yield line, rec
    except csv.Error as e:
        raise _error(path, reader.line_num, None, f"not a readable CSV table ({e})") from None


def read_table(path: str | Path) -> list[Located]:
    """Parse and validate every row of an import table (CSV or JSONL)."""
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: no such file")
    out: list[Located] = []
    typed = _is_jsonl(p)  # JSON values are typed: validated strictly (see the module doc)
    try:
        for line, rec in _raw_records(p):
            try:
                row = ImportRow.model_validate(rec, strict=typed, context={"typed": typed})
                out.append(Located(row, line))
            except ValidationError as e:
                err = e.errors()[0]
                column = ".".join(str(x) for x in err["loc"]) or None
                raise _error(p, line, column, err["msg"].removeprefix("Value error, ")) from None
    except UnicodeDecodeError as e:
        raise _error(p, None, None, f"not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise _error(p, None, None, f"cannot be read ({e})") from None
    if not out:
        raise _error(p, None, None, "holds no rows")
    return out


def group_rows(rows: Sequence[Located], path: str | Path) -> dict[str, dict[str, Located]]:
    """question id → model → row, in first-seen order; checks that every question has one row
    per model (the same models for every question) and one question text."""
    p = Path(path)
    by_q: dict[str, dict[str, Located]] = {}
    for loc in rows:
        r = loc.row
        models = by_q.setdefault(r.question_id, {})
        if r.model in models:
            first = models[r.model].line
            raise _error(
                p, loc.line, "model", f"'{r.model}' answers '{r.question_id}' twice (row {first})"
            )
        if models:
            other = next(iter(models.values()))
            if other.row.question != r.question:
                raise _error(
                    p,
                    loc.line,
                    "question",
                    f"differs from row {other.line} for the same question_id '{r.question_id}'",
                )
        models[r.model] = loc
    all_models = sorted({r.row.model for r in rows})
    for qid, models in by_q.items():
        lacking = [m for m in all_models if m not in models]
        if lacking:
            last = max(loc.line for loc in models.values())
            raise _error(
                p,
                last,
                "model",
                f"question '{qid}' has no row for model '{lacking[0]}' (every question needs "
                f"one row per model: {', '.join(all_models)})",
            )
    if len(all_models) < 2:
        raise _error(p, None, "model", "a cascade needs at least two models; found one")
    return by_q


def plan_cascade(
    by_q: dict[str, dict[str, Located]], prices: PriceTable, guide: str | None = None
) -> Cascade:
    """Order the models by mean cost per question (cheapest first) and pair them in rounds.

    Raises :class:`~ccpo.errors.UnknownModelPriceError` for a model without a price, and a
    :class:`CCPOError` for a named guide that is not in the table.
    """
    models = sorted(next(iter(by_q.values())))
    prices.check(models)
    cost = {
        m: sum(prices.cost(m, q[m].row.input_tokens, q[m].row.output_tokens) for q in by_q.values())
        / len(by_q)
        for m in models
    }
    order = sorted(models, key=lambda m: (cost[m], m))
    if guide is None:
        return Cascade(tuple(order[:-1]), tuple(order[1:]), cost)
    if guide not in models:
        raise CCPOError(f"--guide '{guide}' is not a model of the table ({', '.join(models)})")
    bases = tuple(m for m in order if m != guide)
    return Cascade(bases, (guide,) * len(bases), cost)


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


def _steps(rows: dict[str, Located], ladder: Ladder) -> dict[tuple[int, str], dict[str, Any]]:
    """Every step of one question's ladder as schema fields: a model's row, or for a step that
    repeats an earlier call, that step's answer and signals (:func:`transfer_signal`) with
    zero usage: paid once, where first asked."""
    steps: dict[tuple[int, str], dict[str, Any]] = {}
    for t, lr in enumerate(ladder.rounds, start=1):
        for role in ("base", "guide"):
            spec = lr.step(role)
            src = ladder.reused(t, role)
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
            step["prompt"] = spec.prompt
            if role == "base":
                step.update(logprob_mean=sig, logprob_min=sig)
            else:
                step.pop("reasoning")
                step["uncertainty"] = sig
            steps[(t, role)] = step
    return steps


def _rounds(rows: dict[str, Located], ladder: Ladder) -> list[Round]:
    """One question's rounds: verdict ``yes`` iff the guide's answer is the base's."""
    steps = _steps(rows, ladder)
    out = []
    for t in range(1, ladder.T + 1):
        b, g = steps[(t, "base")], steps[(t, "guide")]
        agree = exact_match(g["answer"], [b["answer"]], ladder.task, ladder.family)
        out.append(
            Round(
                round=t,
                verdict_mode="agree",
                base=BaseStep(**b),
                guide=GuideStep(**g, verdict="yes" if agree else "no"),
            )
        )
    return out


def build_traces(
    by_q: dict[str, dict[str, Located]],
    cascade: Cascade,
    task: str,
    source: str,
    family: str | None = None,
) -> list[Trace]:
    """One trace per question, rounds as planned by ``cascade`` (an ``agree`` ladder)."""
    ladder = cascade.ladder(task, family)
    norm = normalizer_for(task, ladder.family)
    out = []
    for qid, rows in by_q.items():
        any_row = next(iter(rows.values())).row
        rounds = _rounds(rows, ladder)
        gold = _gold(rows, norm)
        meta: dict[str, Any] = {
            "source": f"imported from {source} by ccpo traces import",
            "collected_at": "unknown (imported table)",
            "imported": True,
        }
        if gold == [NO_GOLD]:
            meta["gold_unknown"] = True
        out.append(
            Trace(
                schema=SCHEMA_VERSION,
                id=qid,
                task=task,
                family=None if task.lower() in BUILTIN_TASKS else ladder.family,
                question=any_row.question,
                gold=gold,
                rounds=rounds,
                meta=meta,
            )
        )
    return out


def import_table(
    path: str | Path,
    task: str,
    prices: PriceTable,
    guide: str | None = None,
    family: str | None = None,
) -> tuple[list[Trace], Cascade]:
    """Read ``path`` and return its traces and the cascade they follow (see module doc)."""
    try:
        family_of(task, family)
    except ValueError as e:
        raise CCPOError(f"--family: {e}") from None
    p = Path(path)
    by_q = group_rows(read_table(p), p)
    cascade = plan_cascade(by_q, prices, guide)
    return build_traces(by_q, cascade, task, p.name, family), cascade
