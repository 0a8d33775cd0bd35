"""Trace I/O: round trips, streaming, and one clear error per kind of bad input."""

from __future__ import annotations

import gzip
import json

import pytest

from ccpo.errors import TraceFormatError
from ccpo.traces.io import TraceWriter, iter_traces, read_traces, write_traces


def _lines(traces):
    return [json.dumps(t.to_json_dict()) for t in traces]


def test_round_trip_plain_and_gzip(tmp_path, sim_traces):
    for name in ("a.jsonl", "a.jsonl.gz"):
        p = tmp_path / name
        assert write_traces(p, sim_traces[:20]) == 20
        back = read_traces(p)
        assert [t.to_json_dict() for t in back] == [t.to_json_dict() for t in sim_traces[:20]]
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as fh:
        first = json.loads(fh.readline())
    assert next(iter(first)) == "schema" and first["schema"] == "ccpo.trace/v1"


def test_reader_streams_lazily(tmp_path, sim_traces):
    """A bad line late in the file is only reached when the stream gets there."""
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join([*_lines(sim_traces[:3]), "{not json"]) + "\n")
    it = iter_traces(p)
    assert next(it).id == sim_traces[0].id
    with pytest.raises(TraceFormatError):
        list(it)


def test_writer_appends_and_flushes(tmp_path, sim_traces):
    p = tmp_path / "w.jsonl"
    with TraceWriter(p) as w:
        w.write(sim_traces[0])
        assert p.read_text().count("\n") == 1  # flushed before close
    with TraceWriter(p) as w:
        w.write(sim_traces[1])
    assert [t.id for t in read_traces(p)] == [sim_traces[0].id, sim_traces[1].id]


def _bad(tmp_path, sim_traces, mutate, line=2):
    objs = [t.to_json_dict() for t in sim_traces[:3]]
    text = [json.dumps(o) for o in objs]
    text[line - 1] = mutate(objs[line - 1])
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(text) + "\n")
    with pytest.raises(TraceFormatError) as ei:
        read_traces(p)
    return ei.value


def test_malformed_json_names_file_and_line(tmp_path, sim_traces):
    e = _bad(tmp_path, sim_traces, lambda o: '{"schema": "ccpo.trace/v1", ')
    assert e.line == 2 and "bad.jsonl:2" in str(e) and "malformed JSON" in str(e)


def test_wrong_schema_version(tmp_path, sim_traces):
    e = _bad(tmp_path, sim_traces, lambda o: json.dumps({**o, "schema": "ccpo.trace/v0"}))
    assert e.field == "schema" and "ccpo.trace/v0" in str(e)


def test_rounds_out_of_order(tmp_path, sim_traces):
    def swap(o):
        o["rounds"][0], o["rounds"][1] = o["rounds"][1], o["rounds"][0]
        return json.dumps(o)

    e = _bad(tmp_path, sim_traces, swap)
    assert e.field == "rounds" and "order" in str(e)


def test_missing_round(tmp_path, sim_traces):
    def drop(o):
        del o["rounds"][1]
        return json.dumps(o)

    e = _bad(tmp_path, sim_traces, drop, line=3)
    assert e.line == 3 and "without gaps" in str(e)


def test_missing_field_is_named(tmp_path, sim_traces):
    def drop(o):
        del o["rounds"][0]["guide"]["correct"]
        return json.dumps(o)

    e = _bad(tmp_path, sim_traces, drop)
    assert e.field == "rounds.0.guide.correct" and "missing" in str(e)


def test_wrong_type_is_named(tmp_path, sim_traces):
    def bad(o):
        o["rounds"][2]["base"]["usage"]["input_tokens"] = "many"
        return json.dumps(o)

    e = _bad(tmp_path, sim_traces, bad)
    assert e.field == "rounds.2.base.usage.input_tokens"


def test_empty_and_missing_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(TraceFormatError, match="empty"):
        read_traces(p)
    with pytest.raises(TraceFormatError, match="no such file"):
        read_traces(tmp_path / "nope.jsonl")


def test_nulls_are_allowed(tmp_path, sim_traces):
    o = sim_traces[0].to_json_dict()
    for r in o["rounds"]:
        r["base"]["logprob_mean"] = None
        r["guide"]["uncertainty"] = None
        r.pop("policy_llm")
    p = tmp_path / "n.jsonl"
    p.write_text(json.dumps(o) + "\n")
    (tr,) = read_traces(p)
    assert tr.rounds[0].guide.uncertainty is None and tr.rounds[0].policy_llm is None
