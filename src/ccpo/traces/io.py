"""Streaming reader and writer for ``ccpo.trace/v1`` files (``.jsonl`` or ``.jsonl.gz``).

The reader validates line by line and never holds the whole file; every problem becomes a
:class:`~ccpo.errors.TraceFormatError` naming the file, the 1-based line and the field.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from ccpo.errors import TraceFormatError
from ccpo.traces.schema import SCHEMA_VERSION, Trace


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode.replace("t", "") + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _field_of(err: ValidationError) -> tuple[str | None, str]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if first["type"] == "missing":
        msg = "is required but missing"
    return loc, msg


def parse_trace_line(text: str, path: str | Path = "<string>", line: int | None = None) -> Trace:
    """Parse and validate one JSON line into a :class:`Trace` (errors name path/line/field)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(str(path), line, None, f"malformed JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(str(path), line, None, "expected a JSON object per line")
    schema = obj.get("schema")
    if schema != SCHEMA_VERSION:
        found = "missing" if schema is None else repr(schema)
        raise TraceFormatError(
            str(path), line, "schema", f"expected '{SCHEMA_VERSION}', found {found}"
        )
    try:
        return Trace.model_validate(obj)
    except ValidationError as e:
        field, msg = _field_of(e)
        raise TraceFormatError(str(path), line, field, msg) from None


def iter_traces(path: str | Path) -> Iterator[Trace]:
    """Yield validated traces one at a time; blank lines are skipped.

    Raises ``TraceFormatError`` for a missing or empty file and for any bad line.
    """
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(str(p), None, None, "no such file")
    if p.is_dir():
        raise TraceFormatError(
            str(p), None, None, "is a folder, expected a .jsonl or .jsonl.gz file"
        )
    n = 0
    try:
        with _open_text(p, "rt") as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                n += 1
                yield parse_trace_line(text, p, lineno)
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceFormatError(str(p), None, None, f"cannot be read ({e})") from None
    if n == 0:
        raise TraceFormatError(str(p), None, None, "holds no traces (the file is empty)")


def read_traces(path: str | Path) -> list[Trace]:
    """Read a whole trace file into memory (validating every line)."""
    return list(iter_traces(path))


def dumps_trace(trace: Trace) -> str:
    """One trace as one compact JSON line (no newline)."""
    return json.dumps(trace.to_json_dict(), ensure_ascii=False, separators=(",", ":"))


class TraceWriter:
    """Append-only writer: each trace is one flushed line, so a killed run loses nothing written.

    >>> with TraceWriter("out.jsonl") as w:  # doctest: +SKIP
    ...     w.write(trace)
    """

    def __init__(self, path: str | Path, append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "at" if append else "wt"
        self._fh = _open_text(self.path, mode)

    def write(self, trace: Trace) -> None:
        self._fh.write(dumps_trace(trace) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_traces(path: str | Path, traces: Iterable[Trace]) -> int:
    """Write traces to a new file (overwriting); returns how many were written."""
    n = 0
    with TraceWriter(path, append=False) as w:
        for t in traces:
            w.write(t)
            n += 1
    return n
