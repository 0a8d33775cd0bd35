"""Question loaders: MMLU, HotpotQA and JSONL files, the bundled data, unknown tasks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ccpo.errors import CCPOError
from ccpo.llm.tasks import load_questions
from ccpo.llm.tasks.loaders import load_hotpotqa, load_jsonl, load_mmlu


# ----------------------------------------------------------------------------- loaders
def test_mmlu_loader_file_and_folder(tmp_path: Path) -> None:
    f = tmp_path / "astronomy_test.csv"
    f.write_text('"What, is 2+2?",3,4,5,6,B\nSky colour?,red,blue,green,black,b\n')
    qs = load_mmlu(f)
    assert [q.id for q in qs] == ["mmlu-astronomy-0", "mmlu-astronomy-1"]
    assert qs[0].question.splitlines() == ["What, is 2+2?", "A. 3", "B. 4", "C. 5", "D. 6"]
    assert qs[0].gold == ["B"] and qs[1].gold == ["B"]
    assert qs[0].meta["subject"] == "astronomy"
    assert len(load_mmlu(tmp_path)) == 2


def test_mmlu_loader_errors(tmp_path: Path) -> None:
    f = tmp_path / "x_test.csv"
    f.write_text("q,a,b,c,d,E\n")
    with pytest.raises(CCPOError, match=r"x_test.csv:1: answer must be"):
        load_mmlu(f)
    f.write_text("q,a,b\n")
    with pytest.raises(CCPOError, match="expected 6 columns"):
        load_mmlu(f)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CCPOError, match=r"no \.csv files"):
        load_mmlu(tmp_path / "empty")


def test_hotpotqa_loader_both_context_layouts(tmp_path: Path) -> None:
    recs = [
        {
            "_id": "a1",
            "question": "Q1?",
            "answer": "Paris",
            "context": [["France", ["Paris is the capital. ", "It is big."]]],
        },
        {
            "question": "Q2?",
            "answer": "Berlin",
            "type": "bridge",
            "context": {"title": ["Germany"], "sentences": [["Berlin is the capital."]]},
        },
        {"question": "Q3?", "answer": "x"},
    ]
    p = tmp_path / "h.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump(recs, fh)
    qs = load_hotpotqa(p)
    assert [q.id for q in qs] == ["hotpotqa-a1", "hotpotqa-dev-1", "hotpotqa-dev-2"]
    assert qs[0].context[0].title == "France" and qs[0].context[0].sentences[1] == "It is big."
    assert qs[1].context[0].text == "Berlin is the capital."
    assert qs[2].context is None
    assert qs[1].meta == {"type": "bridge"}


def test_jsonl_loader(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text(
        '{"id": "1", "question": "Capital of France?", "gold": "Paris"}\n\n'
        '{"id": "2", "question": "Two?", "gold": ["2", "two"]}\n'
    )
    qs = load_jsonl(p)
    assert qs[0].gold == ["Paris"] and qs[1].gold == ["2", "two"] and qs[0].task == "jsonl"
    p.write_text('{"id": "1", "question": "x"}\n')
    with pytest.raises(CCPOError, match=r"q.jsonl:1: field 'gold' is required"):
        load_jsonl(p)
    p.write_text(
        '{"id": "1", "question": "x", "gold": "a"}\n{"id": "1", "question": "y", "gold": "b"}\n'
    )
    with pytest.raises(CCPOError, match="duplicate id"):
        load_jsonl(p)
    p.write_text("{not json\n")
    with pytest.raises(CCPOError, match="malformed JSON"):
        load_jsonl(p)


def test_bundled_data_loads_and_is_small() -> None:
    mmlu = load_questions("mmlu")
    hot = load_questions("hotpotqa")
    assert len(mmlu) > 300 and all(q.gold[0] in "ABCD" for q in mmlu)
    assert len(hot) == 100 and all(q.context and len(q.context) == 10 for q in hot)
    import ccpo.data

    root = Path(ccpo.data.__file__).parent
    for sub in ("mmlu", "hotpotqa"):
        assert (root / sub / "LICENSE").is_file() and (root / sub / "README.md").is_file()
        size = sum(f.stat().st_size for f in (root / sub).iterdir())
        assert size < 400_000


def test_a_task_that_is_not_built_in_needs_its_questions(tmp_path) -> None:
    with pytest.raises(CCPOError, match=r"task 'gsm8k' is not built in .* pass --data FILE"):
        load_questions("gsm8k")
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "question": "2 + 2?", "gold": "4"}\n')
    (q,) = load_questions("gsm8k", f)
    assert (q.task, q.question, q.gold) == ("gsm8k", "2 + 2?", ["4"])
