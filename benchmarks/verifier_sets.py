"""Builds the bundled ``arena-public`` with a SIMULATED verifier's verify steps, for
``bench_arena.py --data FILE`` (results: benchmarks/results/verifier.md).

The bundled set carries no verdicts, so each build is ``ccpo traces import``'s own code on the
set's table (read back from its traces: question, conversation, each model's reply, score and
tokens; re-imported without a verifier it gives the bundled traces back, checked here, up to
the order of each question's gold answers) with
``--verifier MODEL --simulate-verifier ACCURACY`` (:mod:`ccpo.traces.verify`: each verdict is
the reply's judged label flipped with probability 1 − ACCURACY by a hash of (question id,
model); the prompt's and the reply's tokens in, one out, at MODEL's price), after every step
but the last (``each``) or after the named models' steps. The verdicts are simulated: the
files say so (``meta.simulated_verifier``), and so does every report built from them.

    python benchmarks/verifier_sets.py [--verifier gpt-3.5-turbo-1106]
        [--accuracy 0.7 --accuracy 0.8 --accuracy 0.9]
        [--after each --after mixtral-8x7b-instruct-v0.1] [--out runs/verifier]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ccpo.evaluation.harness import sidecar_path
from ccpo.evaluation.reproduce import resolve_data
from ccpo.traces.accept import parse_rule
from ccpo.traces.importer import import_signals, open_table, with_text_signals
from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.prices import load_prices
from ccpo.traces.signals import is_solo

RULE = "score>=reference-1"  # the set's acceptance rule (its card)


def table_of(traces, path: Path) -> Path:
    """The import table a one-model trace set was made from (one row per question and step)."""
    with path.open("w", encoding="utf-8") as fh:
        for tr in traces:
            for r in tr.rounds:
                assert is_solo(r), "a one-model ladder"
                s = r.base
                row = {"question_id": tr.id, "question": tr.question, "messages": tr.messages,
                       "model": s.model, "answer": s.answer, "score": s.model_extra["score"],
                       "input_tokens": s.usage.input_tokens,
                       "output_tokens": s.usage.output_tokens}  # fmt: skip
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _key(tr) -> dict:
    """A trace as JSON, its gold answers as a set (the table lists models in ladder order)."""
    return {**tr.to_json_dict(), "gold": sorted(tr.gold)}


def build(table: Path, prices_file: Path, out: Path, signals, **verify) -> Path:
    """``table`` imported as the set was (task, family, rule, signals), with ``verify``
    (``verifier``, ``verify_after``, ``simulate``); written to ``out`` with its prices."""
    prices = load_prices(prices_file)
    with open_table(table, "arena", prices, family="chat", accept=parse_rule(RULE),
                    **verify) as imp:  # fmt: skip
        write_traces(out, (with_text_signals(tr, signals) for tr in imp.traces()))
    shutil.copyfile(prices_file, sidecar_path(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verifier", default="gpt-3.5-turbo-1106")
    ap.add_argument("--accuracy", type=float, action="append")
    ap.add_argument("--after", action="append", help="each, or a model (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("runs/verifier"))
    args = ap.parse_args()
    (_, path), *_ = resolve_data(["arena-public"]).items()
    traces = read_traces(path)
    signals = import_signals(list(traces[0].signals or ()))
    args.out.mkdir(parents=True, exist_ok=True)
    table = table_of(traces, args.out / "arena-public.table.jsonl")
    prices_file = sidecar_path(path)
    again = build(table, prices_file, args.out / "arena-public.jsonl.gz", signals)
    same = [_key(a) for a in read_traces(again)] == [_key(t) for t in traces]
    print(f"re-imported without a verifier: {'the bundled traces' if same else 'DIFFERENT'}")
    assert same, "the table does not give the bundled set back"
    for acc in args.accuracy or (0.7, 0.8, 0.9):
        for after in args.after or ("each", "mixtral-8x7b-instruct-v0.1"):
            tag = "each" if after == "each" else after.split("-")[0]
            out = args.out / f"arena-public.verify-{tag}.sim{acc:g}.jsonl.gz"
            named = None if after == "each" else [after]
            build(table, prices_file, out, signals, verifier=args.verifier, verify_after=named,
                  simulate=acc)  # fmt: skip
            print(f"wrote {out} (verdicts SIMULATED at accuracy {acc:g}, after {after})")


if __name__ == "__main__":
    main()
