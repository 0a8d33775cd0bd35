"""``traces import`` of a chat app's logs: a ``messages`` column (a JSON array in JSONL, its
JSON text in a CSV cell) becomes each trace's conversation, the last user turn its question,
every reply kept as written; a conversation that cannot be passed on is refused by row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ccpo.errors import CCPOError
from ccpo.traces.importer import import_table
from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.prices import prices_from_mapping
from tests.helpers.chat import conversation

PRICES = prices_from_mapping(
    {
        "as_of": "2026-11-01",
        "source": "test",
        "models": {
            m: {"input_usd_per_mtok": p, "output_usd_per_mtok": p}
            for m, p in (("small-m", 0.1), ("big-m", 5.0))
        },
    },
    "test",
)


def _rows() -> list[dict]:
    """Two conversations ending in the same follow-up; replies with white space to keep."""
    out = []
    for i in range(2):
        for model, reply in (
            ("small-m", f"  Order {i}: refund.\n"),
            ("big-m", f"Order {i}: refund."),
        ):
            out.append({"question_id": f"c{i}", "messages": conversation(i), "model": model,
                        "answer": reply, "input_tokens": 40, "output_tokens": 6})  # fmt: skip
    return out


def _write(tmp: Path, rows: list[dict], kind: str) -> Path:
    if kind == "jsonl":
        p = tmp / "logs.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return p
    p = tmp / "logs.csv"
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "messages": json.dumps(r["messages"])} for r in rows)
    return p


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_messages_column_becomes_the_conversation(tmp_path, kind) -> None:
    traces, _ = import_table(_write(tmp_path, _rows(), kind), "chat", PRICES)
    for i, tr in enumerate(traces):  # one model per step
        assert tr.messages == conversation(i) and tr.question == "Same options."
        assert tr.rounds[0].base.answer == f"  Order {i}: refund.\n"  # as written
        assert tr.rounds[1].base.answer == f"Order {i}: refund."
        assert tr.rounds[0].guide.answer == tr.rounds[0].base.answer  # the same call
        assert tr.rounds[0].base.prompt == "chat" and tr.meta["labels"] == "reference:big-m"
    out = tmp_path / "out.jsonl"
    write_traces(out, traces)
    assert [t.messages for t in read_traces(out)] == [t.messages for t in traces]
    pairs, _ = import_table(_write(tmp_path, _rows(), kind), "chat", PRICES, steps="pair")
    assert pairs[0].rounds[0].guide.answer == "Order 0: refund."
    assert pairs[0].rounds[0].guide.verdict == "no"  # verbatim comparison: not the same reply


def test_a_table_without_messages_still_reads_as_before(tmp_path) -> None:
    rows = [{k: v for k, v in r.items() if k != "messages"} | {"question": "Same options."}
            for r in _rows()[:2]]  # fmt: skip
    (tr,) = import_table(_write(tmp_path, rows, "jsonl"), "chat", PRICES)[0]
    assert tr.messages is None and "messages" not in tr.to_json_dict()


@pytest.mark.parametrize(
    ("change", "column", "needle"),
    [
        (
            {"messages": [{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]},
            "messages",
            "role 'tool' cannot be passed on",
        ),
        ({"messages": conversation(1)}, "messages", "differs from row 1"),
    ],
)
def test_a_bad_conversation_is_refused_by_row_and_column(tmp_path, change, column, needle):
    rows = _rows()
    rows[1] = {**rows[1], **change}
    with pytest.raises(CCPOError) as e:
        import_table(_write(tmp_path, rows, "jsonl"), "chat", PRICES)
    assert f"logs.jsonl: row 2, column '{column}': " in str(e.value)  # JSONL: row = line
    assert needle in str(e.value)
