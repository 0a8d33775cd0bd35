"""Reading an import table: its rows parsed and validated, each with where it came from.

:func:`read_table` (in memory) and :func:`validated_rows` (streamed) read a CSV (header first,
row 1 as a spreadsheet numbers it; a cell may span lines) or JSON Lines table (``.jsonl``,
``.json``, ``.ndjson``; row = line), optionally gzipped, with LF, CRLF or bare-CR line ends,
into :class:`ImportRow` s (:class:`Located`: with their row number). A CSV's cells are text and
are parsed (``correct`` as ``true``/``1``/``yes``...); a JSONL row is typed and read strictly.
Every problem is a one-line :class:`~ccpo.errors.CCPOError` naming the file, row and column
(:func:`table_error`). The columns: docs/import.md.
"""

from __future__ import annotations

import csv
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ccpo.errors import CCPOError
from ccpo.traces.conversation import Conversation, ConversationError, conversation_of
from ccpo.traces.io import cr_only, iter_lines, loads_strict

REQUIRED_COLUMNS = (
    "question_id",
    "question",
    "model",
    "answer",
    "input_tokens",
    "output_tokens",
)
OPTIONAL_COLUMNS = (
    "correct", "logprob", "confidence", "gold", "reasoning", "score", "messages",
    *("verdict", "verdict_input_tokens", "verdict_output_tokens", "verdict_confidence"),
)  # fmt: skip
#: the columns of a verifier's verdict on the row's answer (``traces import --verifier``)
VERDICT_COLUMNS = OPTIONAL_COLUMNS[-4:]
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


class ImportRow(BaseModel):
    """One row of an import table: one model's answer to one question (``correct`` is None
    in a table without labels)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    question_id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    model: str = Field(min_length=1)
    answer: Annotated[str, StringConstraints(strip_whitespace=False)] = ""
    correct: bool | None = None
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    logprob: float | None = Field(None, le=0)
    confidence: float | None = Field(None, ge=0, le=1)
    gold: str | None = None
    reasoning: str = ""
    score: float | None = Field(None, allow_inf_nan=False)  # labels with --accept
    #: the conversation the answer replies to (OpenAI messages of text; its last user turn is
    #: the question): a JSON array in a JSONL table, its JSON text in a CSV cell
    messages: list[dict[str, Any]] | None = None
    #: a verifier's verdict on this answer (``--verifier``): yes / no (None: none readable),
    #: the verdict call's usage and its probability of the verdict it gave
    verdict: Literal["yes", "no"] | None = None
    verdict_input_tokens: int | None = Field(None, ge=0)
    verdict_output_tokens: int | None = Field(None, ge=0)
    verdict_confidence: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _question_of_messages(cls, data: Any, info: ValidationInfo) -> Any:
        """The row's ``messages`` parsed once (the column then takes the conversation), its
        last user turn the question when the question is blank."""
        if not isinstance(data, dict) or data.get("messages") is None:
            return data
        try:
            conv = conversation_of(_json_cell(data["messages"], info))
        except (ConversationError, ValueError):
            conv = None  # the column's own check says why
        out = dict(data) if conv is None else {**data, "messages": conv}
        if not str(data.get("question") or "").strip():
            out["question"] = "?" if conv is None else conv.text
        return out

    @field_validator("messages", mode="before")
    @classmethod
    def _conversation(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, Conversation):  # parsed by _question_of_messages
            return v.as_list()
        v = _json_cell(v, info)
        try:
            return None if v is None else conversation_of(v).as_list()
        except ConversationError as e:
            raise ValueError(str(e)) from None

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

    @field_validator("verdict", mode="before")
    @classmethod
    def _verdict_word(cls, v: Any) -> Any:
        if isinstance(v, str):
            s = v.strip().lower()
            return None if not s else {"y": "yes", "n": "no"}.get(s, s)
        return v

    @field_validator(
        "logprob", "confidence", "score", "verdict_input_tokens", "verdict_output_tokens",
        "verdict_confidence", mode="before",
    )  # fmt: skip
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

    @field_validator("answer")
    @classmethod
    def _trimmed_unless_verbatim(cls, v: str, info: ValidationInfo) -> str:
        """Trimmed like every cell, except a chat reply (kept verbatim: ``verbatim``)."""
        return v if (info.context or {}).get("verbatim") else v.strip()

    def probability(self) -> float | None:
        """The row's probability that its answer is right: ``confidence``, else
        ``exp(logprob)``, else None."""
        if self.confidence is not None:
            return self.confidence
        return None if self.logprob is None else math.exp(self.logprob)


def _json_cell(v: Any, info: ValidationInfo) -> Any:
    """A CSV cell's JSON text parsed (blank: None); a typed table's value as it is."""
    if not isinstance(v, str) or _typed(info):
        return v
    if not v.strip():
        return None
    try:
        return loads_strict(v)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None


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


def table_error(path: Path, line: int | None, column: str | None, msg: str) -> CCPOError:
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
                raise table_error(path, line, None, f"malformed JSON ({e.msg})") from None
            except ValueError as e:  # NaN/Infinity, runaway nesting
                raise table_error(path, line, None, f"malformed JSON ({e})") from None
            if not isinstance(obj, dict):
                raise table_error(path, line, None, "expected one JSON object per line")
            yield line, obj
        return
    reader = csv.DictReader(_text_lines(path, cr))
    try:
        header = reader.fieldnames or []
        needed = [c for c in REQUIRED_COLUMNS if c != "question" or "messages" not in header]
        missing = [c for c in needed if c not in header]
        if missing:
            raise table_error(
                path, 1, missing[0], f"missing from the header (found: {', '.join(header)})"
            )
        for line, rec in enumerate(reader, start=2):
            if None in rec or any(v is None for v in rec.values()):
                raise table_error(path, line, None, f"expected {len(header)} cells like the header")
            yield line, rec
    except csv.Error as e:
        msg = f"not a readable CSV table ({e})"
        if "new-line character" in str(e):
            msg = (
                "a bare CR (\\r) inside a line: the file mixes line ends; save it with LF or "
                "CRLF line ends (e.g. as 'CSV UTF-8' from a spreadsheet)"
            )
        raise table_error(path, max(reader.line_num, 1), None, msg) from None


def validated_rows(path: Path, verbatim: bool = False) -> Iterator[tuple[Located, bool]]:
    """Every row of ``path`` parsed and validated, with whether the table has a ``correct``
    column (the CSV header's, or the first JSONL row's keys); ``verbatim``: answers are kept
    as written (a chat family's replies), not trimmed."""
    typed = _is_jsonl(path)  # JSON values are typed: validated strictly (see the module doc)
    has_correct: bool | None = None
    try:
        for line, rec in _raw_records(path):
            if has_correct is None:
                has_correct = "correct" in rec
            try:
                context = {"typed": typed, "verbatim": verbatim}
                row = ImportRow.model_validate(rec, strict=typed, context=context)
            except ValidationError as e:
                err = e.errors()[0]
                column = ".".join(str(x) for x in err["loc"]) or None
                raise table_error(
                    path, line, column, err["msg"].removeprefix("Value error, ")
                ) from None
            yield Located(row, line), has_correct
    except UnicodeDecodeError as e:
        raise table_error(path, None, None, f"not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise table_error(path, None, None, f"cannot be read ({e})") from None


def read_table(path: str | Path) -> list[Located]:
    """Parse and validate every row of an import table (CSV or JSONL), held in memory (the
    import itself streams: :func:`~ccpo.traces.importer.table.open_table`)."""
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: no such file")
    out = [loc for loc, _ in validated_rows(p)]
    if not out:
        raise table_error(p, None, None, "holds no rows")
    return out
