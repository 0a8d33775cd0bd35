"""The import's temporary SQLite file (:class:`Spill`): the table's rows, checked as they
arrive (one row per question and model, one text per question, token sums per model) and
read back one question at a time, so that the import holds one question in memory, not the
table.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

from ccpo.traces.importer.rows import ImportRow, Located, table_error

_COLUMNS = (
    "answer", "correct", "input_tokens", "output_tokens", "logprob", "confidence", "gold",
    "reasoning", "score", "verdict", "verdict_input_tokens", "verdict_output_tokens",
    "verdict_confidence",
)  # fmt: skip
_SCHEMA = f"""
CREATE TABLE questions (qid TEXT PRIMARY KEY, ord INTEGER NOT NULL, question TEXT NOT NULL,
                        line INTEGER NOT NULL, messages TEXT);
CREATE TABLE rows (qid TEXT NOT NULL, model TEXT NOT NULL, line INTEGER NOT NULL,
                   {", ".join(_COLUMNS)}, PRIMARY KEY (qid, model)) WITHOUT ROWID;
"""


class Spill:
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
        msgs = None if r.messages is None else json.dumps(r.messages, ensure_ascii=False)
        cur = db.execute(
            "INSERT INTO questions VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (r.question_id, self.questions, r.question, loc.line, msgs),
        )
        if cur.rowcount:
            self.questions += 1
        else:
            text, first, had = db.execute(
                "SELECT question, line, messages FROM questions WHERE qid = ?", (r.question_id,)
            ).fetchone()
            for column, here, there in (("question", r.question, text), ("messages", msgs, had)):
                if here != there:
                    raise table_error(
                        self.path,
                        loc.line,
                        column,
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
            raise table_error(
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
            raise table_error(
                self.path,
                last,
                "model",
                f"question '{qid}' has no row for model '{gap}' (every question needs one row "
                f"per model: {', '.join(models)})",
            )
        if len(models) < 2:
            raise table_error(
                self.path, None, "model", "a cascade needs at least two models; found one"
            )
        return models

    def groups(self) -> Iterator[dict[str, Located]]:
        """Each question's rows (model → row, in table order), questions in first-seen order."""
        cur = self.db.execute(
            f"SELECT q.qid, q.question, q.messages, r.model, r.line, "
            f"{', '.join('r.' + c for c in _COLUMNS)} "
            "FROM questions q JOIN rows r ON r.qid = q.qid ORDER BY q.ord, r.line"
        )
        for _, rows in groupby(cur, key=lambda rec: rec[0]):
            group: dict[str, Located] = {}
            for qid, question, msgs, model, line, *values in rows:
                fields = dict(zip(_COLUMNS, values, strict=True))
                if fields["correct"] is not None:
                    fields["correct"] = bool(fields["correct"])
                row = ImportRow.model_construct(
                    question_id=qid,
                    question=question,
                    model=model,
                    messages=None if msgs is None else json.loads(msgs),
                    **fields,
                )
                group[model] = Located(row, line)
            yield group

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        self._dir.cleanup()
