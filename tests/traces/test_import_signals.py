"""``ccpo traces import --signals``: an imported free-text table records the pure signals of
each round, computed from its answers, and a signal that needs a call is refused plainly
before anything is written."""

from __future__ import annotations

import csv
from pathlib import Path

from ccpo.traces.io import read_traces
from ccpo.traces.prices import write_price_file
from ccpo.traces.similarity import char_ngram_cosine, word_jaccard
from tests.helpers.cli import assert_usage_error, ccpo_ok, run_ccpo

REPLIES = {  # synthetic free-text replies of three models to two requests
    "a": ("I'm sorry, but I can't help with that.", "Use a list comprehension: [x for x in xs].",
          "A list comprehension, [x for x in xs], builds the list in one line."),
    "b": ("Rome is the capital.", "The capital of Italy is Rome.", "Rome is Italy's capital."),
}  # fmt: skip
MODELS = ("m-small", "m-mid", "m-big")


def _table(path: Path) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["question_id", "question", "model", "answer", "correct", "input_tokens",
                    "output_tokens"])  # fmt: skip
        for q, replies in REPLIES.items():
            for i, (m, a) in enumerate(zip(MODELS, replies, strict=True)):
                w.writerow([q, f"request {q}", m, a, str(i > 0).lower(), 20, 10 * (i + 1)])
    return path


def test_import_records_the_pure_signals(tmp_path):
    out = tmp_path / "free.jsonl"
    ccpo_ok("traces", "import", str(_table(tmp_path / "t.csv")), "--task", "free",
            "--family", "exact", "--signals", "refusal,similarity", "--out", str(out),
            "--prices", str(_prices(tmp_path)))  # fmt: skip
    traces = read_traces(out)
    assert [t.signals for t in traces] == [["similarity", "refusal"]] * 2
    for tr in traces:  # one model per step: each reply against the step before it
        replies = ["", *(r.base.answer for r in tr.rounds)]
        for i, r in enumerate(tr.rounds):
            b, g = replies[i], replies[i + 1]
            assert g == REPLIES[tr.id][i] and r.guide.answer == g
            assert r.signals.sim_words == word_jaccard(b, g)
            assert r.signals.sim_chars == char_ngram_cosine(b, g)
    a = next(t for t in traces if t.id == "a")
    assert a.rounds[0].signals.guide_refusal and not a.rounds[0].signals.base_refusal
    assert a.rounds[1].signals.base_refusal and not a.rounds[1].signals.guide_refusal
    # pairs (--steps pair): a round's two models' replies
    ccpo_ok("traces", "import", str(_table(tmp_path / "t.csv")), "--task", "free",
            "--family", "exact", "--signals", "similarity", "--out", str(out), "--force",
            "--steps", "pair", "--prices", str(_prices(tmp_path)))  # fmt: skip
    for tr in read_traces(out):
        for r in tr.rounds:
            assert r.signals.sim_words == word_jaccard(r.base.answer, r.guide.answer)


def test_import_refuses_a_signal_that_needs_a_call(tmp_path):
    out = tmp_path / "free.jsonl"
    r = run_ccpo("traces", "import", str(_table(tmp_path / "t.csv")), "--task", "free",
                 "--signals", "similarity,verdict", "--out", str(out))  # fmt: skip
    assert_usage_error(r, "--signals verdict", "needs a call per round")
    assert not out.exists()


def _prices(tmp: Path) -> Path:
    return write_price_file(
        tmp / "p.json", {"m-small": (0.1, 0.4), "m-mid": (1.0, 4.0), "m-big": (5, 20)}, "test"
    )
