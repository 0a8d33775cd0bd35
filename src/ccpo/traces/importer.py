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
correct         no        ``true``/``false`` (in a CSV also ``1``/``0``, ``yes``/``no``);
                          without it, labels by agreement with a reference model
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

**Labels from a reference model** (DESIGN.md, *Labels from a reference*; the contract is
:mod:`ccpo.traces.labels`). A table without ``correct`` (a CSV header without it, or a JSONL
table whose first row has none), or any table imported with ``reference=MODEL``
(``--reference``), is labelled by agreement: a row is correct iff its answer equals the
reference model's answer on that question under the task family's normaliser; the reference's
own answer is therefore correct, every question is solvable, the trace's ``gold`` is the
reference's answer and ``meta.labels`` is ``"reference:<model>"``. The reference is the named
model, else the most expensive model of the table (the last of the cascade). A question whose
reference answer is empty (after normalisation) has nothing to agree with: it is **dropped**,
and counted (:attr:`TableImport.dropped`). With ``correct`` (or ``gold``) in the table and a
reference named, agreement replaces the table's labels (:attr:`TableImport.replaced`).

**Streaming.** The table is read once, row by row, into a temporary SQLite file (validated as
it goes: duplicates, question texts, token sums per model), then each question's rows are read
back in first-seen order and its trace is built and handed on (:meth:`TableImport.traces`):
memory holds one question at a time, not the table. A file whose lines end with a bare CR
(classic Mac OS exports) is read as such (:func:`ccpo.traces.io.cr_only`).

Other columns are ignored. Every problem is a :class:`~ccpo.errors.CCPOError` of one line that
names the file, the row (a CSV's header is row 1, as a spreadsheet shows it; a JSONL row is
its line) and the column.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import sqlite3
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
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
from ccpo.traces.io import cr_only, iter_lines, loads_strict
from ccpo.traces.labels import GOLD, reference_labels, reference_model
from ccpo.traces.ladder import Ladder, LadderRound, Step, agree_signals, transfer_signal
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import SCHEMA_VERSION, BaseStep, GuideStep, Round, Trace, Usage

REQUIRED_COLUMNS = (
    "question_id",
    "question",
    "model",
    "answer",
    "input_tokens",
    "output_tokens",
)
OPTIONAL_COLUMNS = ("correct", "logprob", "confidence", "gold", "reasoning")
NO_GOLD = "<no gold: no model answered correctly>"
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


class ImportRow(BaseModel):
    """One row of an import table: one model's answer to one question (``correct`` is None
    in a table without labels)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    question_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    model: str = Field(min_length=1)
    answer: str = ""
    correct: bool | None = None
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
            if not s:  # no label (refused later unless labels come from a reference)
                return None
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


def _text_lines(path: Path, cr: bool) -> Iterator[str]:
    """The lines of a CSV file, each bounded (:func:`iter_lines`), decoded, BOM dropped."""
    for lineno, raw in iter_lines(path, cr=cr):
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

    def order(self) -> list[str]:
        """The models, cheapest per question first (ties by name)."""
        return sorted(self.cost_per_question, key=lambda m: (self.cost_per_question[m], m))

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
    may span lines) or JSONL (``.jsonl``/``.json``/``.ndjson``: row = line) table; lines may
    end with LF, CRLF or (the whole file) a bare CR."""
    cr = cr_only(path)
    if _is_jsonl(path):
        for line, raw in iter_lines(path, cr=cr):
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
    reader = csv.DictReader(_text_lines(path, cr))
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
        msg = f"not a readable CSV table ({e})"
        if "new-line character" in str(e):
            msg = (
                "a bare CR (\\r) inside a line: the file mixes line ends; save it with LF or "
                "CRLF line ends (e.g. as 'CSV UTF-8' from a spreadsheet)"
            )
        raise _error(path, max(reader.line_num, 1), None, msg) from None


def _validated(path: Path) -> Iterator[tuple[Located, bool]]:
    """Every row of ``path`` parsed and validated, with whether the table has a ``correct``
    column (the CSV header's, or the first JSONL row's keys)."""
    typed = _is_jsonl(path)  # JSON values are typed: validated strictly (see the module doc)
    has_correct: bool | None = None
    try:
        for line, rec in _raw_records(path):
            if has_correct is None:
                has_correct = "correct" in rec
            try:
                row = ImportRow.model_validate(rec, strict=typed, context={"typed": typed})
            except ValidationError as e:
                err = e.errors()[0]
                column = ".".join(str(x) for x in err["loc"]) or None
                raise _error(path, line, column, err["msg"].removeprefix("Value error, ")) from None
            yield Located(row, line), has_correct
    except UnicodeDecodeError as e:
        raise _error(path, None, None, f"not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise _error(path, None, None, f"cannot be read ({e})") from None


def read_table(path: str | Path) -> list[Located]:
    """Parse and validate every row of an import table (CSV or JSONL), held in memory (the
    import itself streams: :func:`open_table`)."""
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: no such file")
    out = [loc for loc, _ in _validated(p)]
    if not out:
        raise _error(p, None, None, "holds no rows")
    return out


_COLUMNS = (
    "answer", "correct", "input_tokens", "output_tokens", "logprob", "confidence", "gold",
    "reasoning",
)  # fmt: skip
_SCHEMA = f"""
CREATE TABLE questions (qid TEXT PRIMARY KEY, ord INTEGER NOT NULL, question TEXT NOT NULL,
                        line INTEGER NOT NULL);
CREATE TABLE rows (qid TEXT NOT NULL, model TEXT NOT NULL, line INTEGER NOT NULL,
                   {", ".join(_COLUMNS)}, PRIMARY KEY (qid, model)) WITHOUT ROWID;
"""


class _Spill:
    """The table's rows in a temporary SQLite file, so that the import holds one question at
    a time: :meth:`add` checks a row against the rows before it, :meth:`groups` reads the
    questions back in first-seen order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._dir = tempfile.TemporaryDirectory(prefix="ccpo-import-")
        self.db = sqlite3.connect(Path(self._dir.name) / "rows.sqlite")
        self.db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _SCHEMA)
        self.questions = 0
        self.tokens: dict[str, list[int]] = {}  # model -> [input, output] summed

    def add(self, loc: Located) -> None:
        r, db = loc.row, self.db
        cur = db.execute(
            "INSERT INTO questions VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (r.question_id, self.questions, r.question, loc.line),
        )
        if cur.rowcount:
            self.questions += 1
        else:
            text, first = db.execute(
                "SELECT question, line FROM questions WHERE qid = ?", (r.question_id,)
            ).fetchone()
            if text != r.question:
                raise _error(
                    self.path,
                    loc.line,
                    "question",
                    f"differs from row {first} for the same question_id '{r.question_id}'",
                )
        try:
            db.execute(
                f"INSERT INTO rows VALUES (?, ?, ?, {', '.join('?' * len(_COLUMNS))})",
                (r.question_id, r.model, loc.line, *(getattr(r, c) for c in _COLUMNS)),
            )
        except sqlite3.IntegrityError:
            (first,) = db.execute(
                "SELECT line FROM rows WHERE qid = ? AND model = ?", (r.question_id, r.model)
            ).fetchone()
            raise _error(
                self.path,
                loc.line,
                "model",
                f"'{r.model}' answers '{r.question_id}' twice (row {first})",
            ) from None
        tok = self.tokens.setdefault(r.model, [0, 0])
        tok[0] += r.input_tokens
        tok[1] += r.output_tokens

    def check_complete(self) -> list[str]:
        """Every question has one row per model (the same models for every question); the
        models, sorted."""
        models = sorted(self.tokens)
        lacking = self.db.execute(
            "SELECT q.qid, MAX(r.line) FROM questions q JOIN rows r ON r.qid = q.qid "
            "GROUP BY q.qid HAVING COUNT(*) < ? ORDER BY MIN(q.ord) LIMIT 1",
            (len(models),),
        ).fetchone()
        if lacking is not None:
            qid, last = lacking
            have = {m for (m,) in self.db.execute("SELECT model FROM rows WHERE qid = ?", (qid,))}
            gap = next(m for m in models if m not in have)
            raise _error(
                self.path,
                last,
                "model",
                f"question '{qid}' has no row for model '{gap}' (every question needs one row "
                f"per model: {', '.join(models)})",
            )
        if len(models) < 2:
            raise _error(self.path, None, "model", "a cascade needs at least two models; found one")
        return models

    def groups(self) -> Iterator[dict[str, Located]]:
        """Each question's rows (model → row, in table order), questions in first-seen order."""
        cur = self.db.execute(
            f"SELECT q.qid, q.question, r.model, r.line, {', '.join('r.' + c for c in _COLUMNS)} "
            "FROM questions q JOIN rows r ON r.qid = q.qid ORDER BY q.ord, r.line"
        )
        for _, rows in groupby(cur, key=lambda rec: rec[0]):
            group: dict[str, Located] = {}
            for qid, question, model, line, *values in rows:
                fields = dict(zip(_COLUMNS, values, strict=True))
                if fields["correct"] is not None:
                    fields["correct"] = bool(fields["correct"])
                row = ImportRow.model_construct(
                    question_id=qid, question=question, model=model, **fields
                )
                group[model] = Located(row, line)
            yield group

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        self._dir.cleanup()


def plan_cascade(cost: dict[str, float], guide: str | None = None) -> Cascade:
    """Order the models by mean cost per question (``cost``, USD; cheapest first, ties by
    name) and pair them in rounds; a named guide must be a model of the table."""
    models = sorted(cost)
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


def agreement_labels(
    rows: dict[str, Located], reference: str, task: str, family: str | None = None
) -> dict[str, Located] | None:
    """The rows of one question labelled by agreement with ``reference``'s answer (correct iff
    equal under the task family's normaliser; the reference's own answer is correct); None
    when the reference's answer is empty after normalisation (nothing to agree with)."""
    ref = rows[reference].row.answer
    if not normalizer_for(task, family)(ref):
        return None
    return {
        m: Located(
            loc.row.model_copy(
                update={
                    "correct": m == reference or exact_match(loc.row.answer, [ref], task, family)
                }
            ),
            loc.line,
        )
        for m, loc in rows.items()
    }


def build_trace(rows: dict[str, Located], ladder: Ladder, source: str, labels: str = GOLD) -> Trace:
    """One question's trace, its rounds as ``ladder`` plans them (an ``agree`` ladder).
    ``labels``: ``"gold"`` (the rows' ``correct``) or ``"reference:<model>"`` (rows already
    labelled by :func:`agreement_labels`; the gold is the reference's answer)."""
    norm = normalizer_for(ladder.task, ladder.family)
    first = next(iter(rows.values()))
    ref = reference_model(labels)
    gold = [rows[ref].row.answer] if ref is not None else _gold(rows, norm)
    meta: dict[str, Any] = {
        "source": f"imported from {source} by ccpo traces import",
        "collected_at": "unknown (imported table)",
        "imported": True,
    }
    if ref is not None:
        meta["labels"] = labels
    elif gold == [NO_GOLD]:
        meta["gold_unknown"] = True
    task = ladder.task
    return Trace(
        schema=SCHEMA_VERSION,
        id=first.row.question_id,
        task=task,
        family=None if task.lower() in BUILTIN_TASKS else ladder.family,
        question=first.row.question,
        gold=gold,
        rounds=_rounds(rows, ladder),
        meta=meta,
    )


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
    labels: str  # "gold" or "reference:<model>"
    reference_named: bool  # the reference was named (else: the most expensive model)
    replaced: bool  # the table's correct/gold labels are replaced by agreement
    _spill: _Spill
    dropped: list[str] = field(default_factory=list)  # ids without a reference answer

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
        self.dropped = []
        n = 0
        for rows in self._spill.groups():
            if ref is not None:
                labelled = agreement_labels(rows, ref, ladder.task, ladder.family)
                if labelled is None:
                    self.dropped.append(next(iter(rows.values())).row.question_id)
                    continue
                rows = labelled
            n += 1
            yield build_trace(rows, ladder, self.path.name, self.labels)
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
) -> TableImport:
    """Read and check ``path`` (streamed into a temporary file), plan its cascade and its
    labels (see the module doc). Raises :class:`~ccpo.errors.UnknownModelPriceError` for a
    model without a price and a one-line :class:`CCPOError` for any other problem."""
    try:
        family_of(task, family)
    except ValueError as e:
        raise CCPOError(f"--family: {e}") from None
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: no such file")
    spill = _Spill(p)
    try:
        has_correct = has_gold = False
        n = 0
        for loc, has_correct in _validated(p):
            n += 1
            if has_correct and reference is None and loc.row.correct is None:
                raise _error(
                    p,
                    loc.line,
                    "correct",
                    "missing or empty; every row needs it (or label by agreement: "
                    "--reference MODEL)",
                )
            has_gold |= loc.row.gold is not None
            spill.add(loc)
        if n == 0:
            raise _error(p, None, None, "holds no rows")
        models = spill.check_complete()
        prices.check(models)
        cost = {m: prices.cost(m, *spill.tokens[m]) / spill.questions for m in models}
        cascade = plan_cascade(cost, guide)
        if reference is not None and reference not in models:
            raise CCPOError(
                f"--reference '{reference}' is not a model of the table ({', '.join(models)})"
            )
        labelled = has_correct and reference is None
        ref = None if labelled else (reference or cascade.order()[-1])
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
        )
    except BaseException:
        spill.close()
        raise


def import_table(
    path: str | Path,
    task: str,
    prices: PriceTable,
    guide: str | None = None,
    family: str | None = None,
    reference: str | None = None,
) -> tuple[list[Trace], Cascade]:
    """Read ``path`` and return its traces (in memory) and the cascade they follow (see the
    module doc; ``ccpo traces import`` streams them with :func:`open_table`)."""
    with open_table(path, task, prices, guide, family, reference) as imp:
        return list(imp.traces()), imp.cascade
