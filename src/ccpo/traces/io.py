"""Streaming reader and writer for ``ccpo.trace/v1`` files (``.jsonl`` or ``.jsonl.gz``).

The reader validates line by line and never holds the whole file; every problem becomes a
:class:`~ccpo.errors.TraceFormatError` naming the file, the 1-based line and the field. It is the
one validation path of every command that reads traces (``traces validate``, ``traces stats``,
``evaluate``, ``train``, ``reproduce``, the Python API): strict JSON (no ``NaN``/``Infinity``,
no runaway nesting), the schema's bounds
(:mod:`ccpo.traces.schema`), unique ids and one task per file.

Memory is bounded by the longest line allowed, never by the file: lines are read in bounded
pieces (:func:`iter_lines`, also used by ``traces import`` for JSONL tables), a ``.gz`` file is
decompressed only as far as the line being read, and a line longer than
:func:`max_line_bytes` (8 MiB unless ``$CCPO_MAX_LINE_BYTES`` or ``ccpo --max-line-bytes``
says more) is refused, naming the file, the line and the cap, before it is held whole.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from ccpo.errors import CCPOError, TraceFormatError, write_error
from ccpo.traces.schema import SCHEMA_VERSION, Trace


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def loads_strict(text: str) -> object:
    """``json.loads`` without NaN/Infinity and without runaway nesting (ValueError for both)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


MAX_LINE_BYTES = 8 * 2**20
"""The longest line (in bytes, newline excluded) a reader accepts unless told otherwise."""
MAX_LINE_BYTES_ENV = "CCPO_MAX_LINE_BYTES"


def max_line_bytes() -> int:
    """The line cap in force: ``$CCPO_MAX_LINE_BYTES`` (bytes; a positive integer, with an
    optional k/M/G suffix of powers of 1024) when set, else :data:`MAX_LINE_BYTES`."""
    raw = os.environ.get(MAX_LINE_BYTES_ENV, "").strip()
    if not raw:
        return MAX_LINE_BYTES
    return parse_bytes(raw, f"${MAX_LINE_BYTES_ENV}")


def parse_bytes(raw: str, origin: str) -> int:
    """``"8M"`` → 8388608: a positive integer of bytes with an optional k/M/G suffix (powers of
    1024); a :class:`CCPOError` naming ``origin`` otherwise."""
    text = raw.strip()
    scale = {"k": 2**10, "m": 2**20, "g": 2**30}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) <= 0:
        raise CCPOError(
            f"{origin} {raw!r}: expected a positive number of bytes (e.g. 8388608 or 8M)"
        )
    return int(digits) * scale


def _too_long(path: Path, line: int, cap: int) -> TraceFormatError:
    return TraceFormatError(
        str(path),
        line,
        None,
        f"line longer than the cap of {cap} bytes; raise it with ccpo --max-line-bytes N "
        f"(or ${MAX_LINE_BYTES_ENV}) if the file is trusted",
    )


CR_SNIFF_BYTES = 1 << 16
"""How much of a file :func:`cr_only` reads to tell its line ends."""


def cr_only(path: str | Path) -> bool:
    """Whether a text file ends its lines with a bare CR (``\\r``, classic Mac OS and some
    spreadsheet exports): its first :data:`CR_SNIFF_BYTES` bytes hold a CR and no LF."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as fh:
        head = fh.read(CR_SNIFF_BYTES)
    return b"\r" in head and b"\n" not in head


def _cr_lines(fh: IO[bytes], path: Path, limit: int) -> Iterator[tuple[int, bytes]]:
    """:func:`iter_lines` for a file whose lines end with a bare CR (read in 64 KiB pieces)."""
    lineno, rest = 0, b""
    while True:
        chunk = fh.read(1 << 16)
        parts = (rest + chunk).split(b"\r")
        rest = parts.pop()
        for part in parts:
            lineno += 1
            if len(part) > limit:
                raise _too_long(path, lineno, limit)
            yield lineno, part
        if len(rest) > limit:
            raise _too_long(path, lineno + 1, limit)
        if not chunk:
            if rest:
                yield lineno + 1, rest
            return


def iter_lines(
    path: str | Path, cap: int | None = None, cr: bool = False
) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of a text file, ``.gz`` decompressed as it is read, each line
    without its end (``\\n`` or ``\\r\\n``; with ``cr``, a bare ``\\r``: see
    :func:`cr_only`) and at most ``cap`` bytes (default :func:`max_line_bytes`): a longer line
    is refused (:class:`TraceFormatError` naming the file, the line and the cap) after at most
    ``cap + 1`` of its bytes (``cr``: 64 KiB more) were read or decompressed. Errors of the
    file itself (``OSError``, a broken gzip stream) propagate."""
    p = Path(path)
    limit = max_line_bytes() if cap is None else cap
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as fh:
        if cr:
            yield from _cr_lines(fh, p, limit)
            return
        for lineno in itertools.count(1):
            raw = fh.readline(limit + 2)  # + 2: room for the "\r\n" of a line of `limit` bytes
            if not raw:
                return
            text = raw.rstrip(b"\n")
            ended = len(text) < len(raw)
            if text.endswith(b"\r"):
                text = text[:-1]
            if len(text) > limit or (not ended and len(raw) == limit + 2):
                raise _too_long(p, lineno, limit)
            yield lineno, text


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
        obj = loads_strict(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(str(path), line, None, f"malformed JSON ({e.msg})") from None
    except ValueError as e:
        raise TraceFormatError(str(path), line, None, f"malformed JSON ({e})") from None
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
    except RecursionError:
        raise TraceFormatError(str(path), line, None, "nested too deeply") from None
    except ValidationError as e:
        field, msg = _field_of(e)
        raise TraceFormatError(str(path), line, field, msg) from None


#: the columns of a table of model answers (``ccpo traces import``'s input)
_TABLE_COLUMNS = ("question_id", "question", "model", "answer", "correct")


def _table_hint(e: TraceFormatError, path: Path, first_line: str) -> TraceFormatError:
    """``e`` (the first line of a would-be trace file is not a trace) with a pointer to
    ``ccpo traces import`` when the file looks like a table of model answers: a ``.csv`` /
    ``.tsv`` name, a header row naming its columns, or a JSON object with its columns and no
    ``schema``."""
    head = first_line.lower()
    looks_like_table = path.suffix.lower() in (".csv", ".tsv") or (
        not head.lstrip().startswith("{")
        and sum(c in head for c in _TABLE_COLUMNS) >= 2
        and ("," in head or "\t" in head)
    )
    if not looks_like_table and '"schema"' not in head:
        looks_like_table = sum(f'"{c}"' in head for c in _TABLE_COLUMNS) >= 3
    if not looks_like_table:
        return e
    return TraceFormatError(
        e.path,
        e.line,
        e.field,
        f"{e.message}; this looks like a table of model answers, not ccpo.trace/v1 traces: "
        f"turn it into traces with `ccpo traces import {path.name} --task TASK --out "
        "traces.jsonl` (see docs/import.md)",
    )


def iter_traces(path: str | Path) -> Iterator[Trace]:
    """Yield validated traces one at a time; blank lines are skipped.

    Raises ``TraceFormatError`` for a missing or empty file, for any bad line, for an id seen
    before and for a task other than the first line's.
    """
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(str(p), None, None, "no such file")
    if p.is_dir():
        raise TraceFormatError(
            str(p), None, None, "is a folder, expected a .jsonl or .jsonl.gz file"
        )
    n = 0
    first: dict[str, int] = {}  # id -> line
    task: tuple[str, int] | None = None
    try:
        for lineno, raw in iter_lines(p):
            if not raw.strip():
                continue
            n += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceFormatError(
                    str(p), lineno, None, f"not UTF-8 text ({e.reason})"
                ) from None
            try:
                tr = parse_trace_line(text, p, lineno)
            except TraceFormatError as e:
                raise (_table_hint(e, p, text) if n == 1 else e) from None
            if tr.id in first:
                raise TraceFormatError(
                    str(p),
                    lineno,
                    "id",
                    f"'{tr.id}' appears twice (first on line {first[tr.id]})",
                )
            first[tr.id] = lineno
            if task is None:
                task = (tr.task, lineno)
            elif tr.task != task[0]:
                raise TraceFormatError(
                    str(p),
                    lineno,
                    "task",
                    f"'{tr.task}', but line {task[1]} holds '{task[0]}' (one task per file)",
                )
            yield tr
    except (OSError, EOFError, zlib.error) as e:
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

    A line that cannot be written whole (disk full, file too large) is cut off again, so the
    file keeps only whole lines, and a :class:`~ccpo.errors.CCPOError` names the file.

    >>> with TraceWriter("out.jsonl") as w:  # doctest: +SKIP
    ...     w.write(trace)
    """

    def __init__(self, path: str | Path, append: bool = True, shown_as: Path | None = None) -> None:
        self.path = Path(path)
        self.shown_as = shown_as or self.path  # the name in error messages
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = _open_text(self.path, "at" if append else "wt")
        except OSError as e:
            raise write_error(self.shown_as, e) from None

    def write(self, trace: Trace) -> None:
        line = dumps_trace(trace) + "\n"
        try:
            # the file's size, not this handle's position: worker processes of one collect run
            # append to the file through their own handles (one line at a time, under a lock),
            # so a handle's position can lag behind the end, and cutting back to it would cut
            # the other workers' lines
            start = os.fstat(self._fh.fileno()).st_size
        except (OSError, ValueError):  # pragma: no cover - no file behind it
            start = None
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as e:
            self._cut(start)
            raise write_error(self.shown_as, e) from None

    def _cut(self, start: int | None) -> None:
        """Drop a partly written line (best effort: the reader of a resumed run cuts it too)."""
        if start is None or self.path.suffix == ".gz":
            return
        with contextlib.suppress(OSError, ValueError):
            self._fh.close()
        with contextlib.suppress(OSError):
            os.truncate(self.path, start)
        self._fh = _open_text(self.path, "at")

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a flush that failed was reported by write()
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """``with written_whole(p) as tmp:`` write ``tmp`` (beside ``p``, same suffix); it replaces
    ``p`` only once the block ends without error, so a failure (a full disk: exit 1; a
    read-only folder: exit 2) leaves no half-made file and an older ``p`` untouched."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # keeps the suffix (.gz)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise write_error(path, e) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_traces(path: str | Path, traces: Iterable[Trace]) -> int:
    """Write traces to a new file (overwriting) and return how many were written.

    The traces go to a temporary file beside ``path`` that replaces it only once complete, so
    a failure (disk full, say) leaves no half-made file and an older file untouched.
    """
    p = Path(path)
    n = 0
    with written_whole(p) as tmp, TraceWriter(tmp, append=False, shown_as=p) as w:
        for t in traces:
            w.write(t)
            n += 1
    return n
