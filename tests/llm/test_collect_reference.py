"""``ccpo collect --reference MODEL``: questions without gold, labelled by agreement with a
reference model that answers every question, through the same round code for any ladder and
for LLM-EXIT; against the scripted world over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ccpo.llm.collect import collect
from ccpo.testing.scripted_server import prompt_text
from ccpo.traces.answers import exact_match
from ccpo.traces.io import read_traces
from ccpo.traces.labels import labels_of
from tests.helpers.cli import CCPO
from tests.helpers.collecting import cfg_for
from tests.helpers.world import cot_reply, make_world


def _questions(path: Path, n: int, gold: bool = False) -> Path:
    """JSONL questions without gold (with ``gold``: the first has one); question 2 is one the
    reference leaves unanswered in :func:`_world`."""
    lines = []
    for i in range(n):
        rec = {"id": f"q{i}", "question": f"Question number {i} {'silent' if i == 2 else ''}?"}
        if gold and i == 0:
            rec["gold"] = "answer Z"
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _world():
    """The scripted world, where the reference ``policy-m`` says nothing on 'silent' questions."""

    def reply(req: dict) -> str:
        if req.get("model") == "policy-m" and "silent" in prompt_text(req):
            return ""
        return cot_reply(req)

    srv = make_world()
    srv.fallback = reply
    return srv


def _check_agreement(traces, reference: str) -> None:
    assert labels_of(traces) == f"reference:{reference}"
    for t in traces:
        ref = t.meta["reference"]
        assert ref["model"] == reference and t.gold == [ref["answer"]]
        assert t.solvable  # the reference's answer is correct, by definition
        for r in t.rounds:
            for step in (r.base, r.guide):
                assert step.correct == exact_match(step.answer, t.gold, t.task, t.family)


def test_collect_reference_through_the_console_script(tmp_path: Path, prices_file: Path) -> None:
    """The one-pair judge ladder (the paper's) on questions without gold: the reference answers
    every question with a call of its own; the one it leaves unanswered is left out, counted,
    and the run is complete (exit 0)."""
    qs = _questions(tmp_path / "q.jsonl", 4)
    out = tmp_path / "o.jsonl"
    with _world() as srv:
        conf = tmp_path / "c.yaml"
        conf.write_text(f'endpoints:\n  "*": {{url: {srv.url}}}\n', encoding="utf-8")
        res = subprocess.run(
            [CCPO, "collect", "--config", str(conf), "--task", "qa", "--data", str(qs),
             "--base-model", "base-m", "--base-url", srv.url, "--guide-model", "guide-m",
             "--guide-url", srv.url, "--rounds", "2", "--max-retries", "0",
             "--reference", "policy-m", "--prices", str(prices_file), "--out", str(out),
             "--cache", str(tmp_path / "c.sqlite"), "--quiet"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        asked = [r for r in srv.requests if r["model"] == "policy-m"]
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stderr.split())
    assert "labels: agreement with policy-m" in flat
    assert "1 questions left out: the reference gave no answer" in flat and "q2" in flat
    assert len(asked) == 4  # called on every question
    traces = read_traces(out)
    assert sorted(t.id for t in traces) == ["q0", "q1", "q3"]
    _check_agreement(traces, "policy-m")
    assert all(t.meta["reference"]["usage"]["input_tokens"] > 0 for t in traces)
    # gold is refused without a reference, with the hint
    res = subprocess.run(
        [CCPO, "collect", "--task", "qa", "--data", str(qs), "--base-model", "base-m",
         "--guide-model", "guide-m", "--out", str(tmp_path / "x.jsonl")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2 and "field 'gold' is required but missing" in res.stderr
    assert "--reference" in res.stderr


def test_a_reference_on_the_ladder_is_reused_not_asked_again(
    tmp_path: Path, prices_file: Path
) -> None:
    """An agree ladder whose last guide is the reference: its answer is the label, paid once;
    gold present on a question is replaced by agreement."""
    qs = _questions(tmp_path / "q.jsonl", 4, gold=True)
    ladder = [
        {"base": "base-m", "guide": "guide-m", "verdict": "agree"},
        {"base": "guide-m", "guide": "policy-m", "verdict": "agree"},
    ]
    with _world() as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "qa", data=str(qs), ladder=ladder,
                      rounds=2, base_model=None, guide_model=None, reference="policy-m",
                      endpoints={"*": {"url": srv.url}})  # fmt: skip
        s = collect(cfg, progress=False)
        calls = srv.n_completions
    assert s.complete and s.done == 3 and s.dropped == ["q2"]
    assert s.labels == "reference:policy-m"
    assert calls == 4 * 3  # base-m, guide-m, policy-m per question: the reference not again
    traces = read_traces(cfg.out)
    _check_agreement(traces, "policy-m")
    for t in traces:
        assert t.meta["reference"]["reused"] and t.rounds[1].guide.correct
    assert next(t for t in traces if t.id == "q0").gold != ["answer Z"]


@pytest.mark.parametrize("kind", ["llm-exit"])
def test_llm_exit_is_labelled_by_the_same_code(tmp_path: Path, prices_file: Path, kind) -> None:
    qs = _questions(tmp_path / "q.jsonl", 3)
    with _world() as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "qa", data=str(qs), rounds=2,
                      base_model="exit-m", reference="policy-m",
                      endpoints={"*": {"url": srv.url}})  # fmt: skip
        s = collect(cfg, kind, progress=False)
    assert s.complete and s.dropped == ["q2"]
    traces = read_traces(cfg.out)
    assert all(t.meta["kind"] == "llm-exit" for t in traces)
    _check_agreement(traces, "policy-m")
