#!/usr/bin/env python
"""Write the README's quick start 3 example chat log from the bundled ``arena-public`` set.

Usage::

    python scripts/make_chat_example.py --out docs/examples

``docs/examples/chat-logs.jsonl`` is a chat app's log as ``ccpo traces import`` reads it:
one row per conversation and model (``question_id``, ``messages``, ``model``, ``answer``,
``score``, ``input_tokens``, ``output_tokens``), the real replies of the five arena-public
models and the judge's 1-10 scores, copied from the bundled traces (each model's own call of
a question, whatever the traces' round layout). To keep the file small (under 300 KB) it
holds the :data:`N` conversations whose rows are shortest in all, in the bundled file's
order: a sample of short prompts and replies, not of the whole set. Beside it,
``chat-logs.prices.json``: the five models' dated list prices (arena-public's own, sourced).

Reads only files of the package (no download); running it twice gives byte-identical files.
Licence: arena-bench-v1's, Apache-2.0 (NOTICE.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ccpo
from ccpo.traces.io import read_traces
from ccpo.traces.schema import Trace

SOURCE = Path(ccpo.__file__).parent / "data" / "traces" / "arena-public.jsonl.gz"
PRICES = SOURCE.with_name("arena-public.prices.json")
N = 42
"""Conversations in the example: the smallest ones (the whole file stays under 300 KB)."""
NAME = "chat-logs"


def rows_of(tr: Trace) -> list[dict]:
    """One import row per model of ``tr``: the step that called it (never a copy stored as
    ``reused``), in the order the trace first calls them."""
    messages = [dict(m) for m in tr.messages or []]
    rows: dict[str, dict] = {}
    for r in tr.rounds:
        for s in (r.base, r.guide):
            if getattr(s, "reused", False) or s.model in rows:
                continue
            rows[s.model] = {
                "question_id": tr.id,
                "messages": messages,
                "model": s.model,
                "answer": s.answer,
                "score": s.score,
                "input_tokens": s.usage.input_tokens,
                "output_tokens": s.usage.output_tokens,
            }
    return list(rows.values())


def line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def example(source: Path = SOURCE, n: int = N) -> list[dict]:
    """The rows of the ``n`` conversations of ``source`` whose rows are shortest in all, in
    the file's order (ties: the earlier conversation)."""
    per = [rows_of(tr) for tr in read_traces(source)]
    size = [sum(len(line(r).encode()) for r in rows) for rows in per]
    keep = sorted(sorted(range(len(per)), key=lambda i: (size[i], i))[:n])
    return [r for i in keep for r in per[i]]


def prices(models: set[str]) -> dict:
    """arena-public's price file, restricted to ``models``."""
    got = json.loads(PRICES.read_text(encoding="utf-8"))
    got["models"] = {m: p for m, p in got["models"].items() if m in models}
    got["source"] = "arena-public's prices (scripts/make_chat_example.py): " + got["source"]
    return got


def write(out: Path, n: int = N) -> tuple[Path, Path, int]:
    """Write ``chat-logs.jsonl`` and ``chat-logs.prices.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = example(SOURCE, n)
    table = out / f"{NAME}.jsonl"
    table.write_text("".join(line(r) for r in rows), encoding="utf-8")
    side = out / f"{NAME}.prices.json"
    body = json.dumps(prices({r["model"] for r in rows}), indent=1, ensure_ascii=False)
    side.write_text(body + "\n", encoding="utf-8")
    return table, side, len({r["question_id"] for r in rows})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="e.g. docs/examples")
    ap.add_argument("--n", type=int, default=N, help=f"conversations [{N}]")
    args = ap.parse_args(argv)
    table, side, n = write(args.out, args.n)
    print(f"wrote {table} ({n} conversations, {table.stat().st_size} bytes) and {side}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
