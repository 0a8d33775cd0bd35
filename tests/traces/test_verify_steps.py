"""Verify steps: after a one-model step, a verifier model's Yes/No on its reply, priced as its
own call; the reply it returns is the verified one, never paid twice; verdicts come from the
table's verdict columns, or, only when asked, are simulated and said to be everywhere.

Tables are written by the tests (seeded, illustrative numbers, not LLM output). User-facing
behaviour goes through the real ``ccpo`` entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.evaluation.harness import load_episodes
from ccpo.evaluation.prompt_router import rung_arrays
from ccpo.policies import load_policy
from ccpo.traces.featurize import FEATURE_NAMES
from ccpo.traces.importer import import_table
from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.ladder import Ladder, LadderRound, Step, ladder_of, verify_round
from ccpo.traces.prices import load_prices
from ccpo.traces.routing import paid_steps, started_rounds
from ccpo.traces.schema import Trace
from ccpo.traces.signals import compared
from ccpo.traces.steps import sub_ladder
from ccpo.traces.verify import flip_draw
from tests.helpers.cli import ccpo_ok

CHEAP, VERIFIER, STRONG = "gpt-4.1-nano", "gpt-4o-mini", "gpt-4o"
YES = FEATURE_NAMES.index("verdict_yes")


def table(path: Path, n: int, verdicts: bool, seed: int = 3) -> Path:
    """``n`` short-answer questions × three models (JSONL). The cheap model is right on about
    half, the middle one on about 70%, the strong one always; wrong replies look like right
    ones (same length), so only a verdict tells them apart. With ``verdicts``, each row
    carries a verifier's verdict (right 90% of the time) and its usage."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        for model, skill in ((CHEAP, 0.5), (VERIFIER, 0.7), (STRONG, 1.0)):
            ok = bool(rng.random() < skill)
            row = {"question_id": f"q{i:03d}", "question": f"What is item {i}?",
                   "model": model, "answer": f"{'item' if ok else 'iten'} {i}",
                   "correct": ok, "input_tokens": 200 + i, "output_tokens": 20}  # fmt: skip
            if verdicts:
                said = ok if rng.random() < 0.9 else not ok
                row.update(verdict="yes" if said else "no", verdict_confidence=0.75,
                           verdict_input_tokens=300 + i, verdict_output_tokens=1)  # fmt: skip
            rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(path: Path) -> dict[tuple[str, str], dict]:
    return {(r["question_id"], r["model"]): r for r in map(json.loads, path.open())}


def test_a_verify_step_is_the_verifiers_call_on_the_reply_before_it(tmp_path: Path) -> None:
    src = table(tmp_path / "t.jsonl", 40, verdicts=True)
    out = tmp_path / "v.jsonl"
    res = ccpo_ok("traces", "import", str(src), "--task", "qa", "--verifier", VERIFIER,
                  "--signals", "similarity,length", "--out", str(out))  # fmt: skip
    assert f"{VERIFIER} verifies {CHEAP}'s reply" in res.stdout
    assert "verdict columns" in res.stdout and "SIMULATED" not in res.stdout
    traces, rows, prices = read_traces(out), _rows(src), load_prices()
    lad = ladder_of(traces)
    assert [(r.verdict, r.base.model, r.guide.model) for r in lad.rounds] == [
        ("agree", CHEAP, CHEAP),
        ("verify", CHEAP, VERIFIER),
        ("agree", VERIFIER, VERIFIER),
        ("verify", VERIFIER, VERIFIER),
        ("agree", STRONG, STRONG),
    ]  # fmt: skip  (a verify step after each step but the last)
    assert Ladder.from_dict(lad.to_dict()) == lad
    ep, _ = load_episodes(out, [])
    assert ep.verify_rounds == (1, 3) and not ep.one_model and ep.strongest == STRONG
    for i, tr in enumerate(traces):
        for t in (1, 3):
            r, before = tr.rounds[t], tr.rounds[t - 1]
            row = rows[(tr.id, r.base.model)]
            # the reply returned is the verified one: its answer and label, not paid again
            assert r.base.reused and r.base.usage.input_tokens + r.base.usage.output_tokens == 0
            assert r.base.answer == r.guide.answer == before.base.answer
            assert r.guide.correct == r.base.correct == row["correct"]
            assert (r.guide.verdict, r.guide.uncertainty) == (row["verdict"], 0.25)
            # priced as the verifier's own call, exactly
            want = prices.cost(VERIFIER, row["verdict_input_tokens"], 1)
            assert ep.round_cost[i, t] == want
            assert ep.obs[i, t, YES] == float(row["verdict"] == "yes")
        # every call paid once: the models' own rows plus the two verdicts
        calls = sum(prices.cost(m, rows[(tr.id, m)]["input_tokens"], 20)
                    for m in (CHEAP, VERIFIER, STRONG))  # fmt: skip
        verdicts = sum(prices.cost(VERIFIER, rows[(tr.id, m)]["verdict_input_tokens"], 1)
                       for m in (CHEAP, VERIFIER))  # fmt: skip
        assert ep.round_cost[i].sum() == pytest.approx(calls + verdicts, rel=1e-12)
    # the yardstick is still the strong model called alone, and its call alone
    assert ep.strongest_cost == pytest.approx(
        [prices.cost(STRONG, rows[(tr.id, STRONG)]["input_tokens"], 20) for tr in traces]
    )
    # a verify step's signal columns are its reply's (against the one before), never the
    # reply against itself; the step after it compares with the verified reply
    r = traces[0].rounds
    assert [s.answer for s in compared(r, 1)] == ["", r[0].base.answer]
    assert [s.answer for s in compared(r, 2)] == [r[0].base.answer, r[2].base.answer]
    assert compared(r, 2)[0].uncertainty is None  # the verdict's is not the reply's
    # --verify-after names the steps verified
    after, _ = import_table(src, "qa", prices, verifier=VERIFIER, verify_after=[CHEAP])
    assert [x.verdict_mode for x in after[0].rounds] == ["agree", "verify", "agree", "agree"]


def test_a_routed_start_at_a_verify_step_calls_the_reply_then_the_verifier(
    tmp_path: Path,
) -> None:
    traces, _ = import_table(table(tmp_path / "t.jsonl", 3, True), "qa", load_prices(),
                             verifier=VERIFIER)  # fmt: skip
    tr = traces[0]
    (first, *_), want = paid_steps(tr, 1), tr.rounds[0].base.usage
    assert [m for m, _ in first] == [CHEAP, VERIFIER]  # skipped step 1: its reply asked here
    assert first[0][1] == want and first[1][1] == tr.rounds[1].guide.usage
    assert started_rounds(tr, 1)[1].base.usage == want
    assert [[m for m, _ in s] for s in paid_steps(tr, 0)[:2]] == [[CHEAP], [VERIFIER]]
    write_traces(tmp_path / "v.jsonl", traces)
    ep, _ = load_episodes(tmp_path / "v.jsonl", [])
    # the verifier reads the reply: one call after the other (latency adds up)
    from ccpo.traces.latency import call_seconds

    assert ep.routes.latency[1, 0, 1] == pytest.approx(call_seconds(20) + call_seconds(1))
    cost, ok, _ = rung_arrays(ep)  # a rung called alone pays what it runs
    assert cost[0, 1] == pytest.approx(ep.round_cost[0, 0] + ep.round_cost[0, 1])
    assert (ok[:, 1] == ok[:, 0]).all()


def test_simulated_verdicts_are_asked_for_said_and_flip_at_the_stated_rate(
    tmp_path: Path,
) -> None:
    src = table(tmp_path / "t.jsonl", 250, verdicts=False)
    prices = load_prices()
    with pytest.raises(CCPOError, match=r"records no verdicts.*--simulate-verifier"):
        import_table(src, "qa", prices, verifier=VERIFIER)  # never simulated silently
    with pytest.raises(CCPOError, match="drop --simulate-verifier"):
        import_table(table(tmp_path / "c.jsonl", 3, True), "qa", prices, verifier=VERIFIER,
                     simulate=0.8)  # fmt: skip
    with pytest.raises(CCPOError, match="last step's reply"):
        import_table(src, "qa", prices, verifier=VERIFIER, verify_after=[STRONG], simulate=1)
    with pytest.raises(CCPOError, match="one-model steps"):
        import_table(src, "qa", prices, verifier=VERIFIER, steps="pair", simulate=1)
    out = tmp_path / "sim.jsonl"
    res = ccpo_ok("traces", "import", str(src), "--task", "qa", "--verifier", VERIFIER,
                  "--simulate-verifier", "0.8", "--out", str(out))  # fmt: skip
    assert "SIMULATED" in res.stdout
    traces = read_traces(out)
    assert traces[0].meta["simulated_verifier"]["accuracy"] == 0.8
    steps = [r for tr in traces for r in tr.rounds if r.verdict_mode == "verify"]
    flips = np.array([(r.guide.verdict == "yes") != r.base.correct for r in steps])
    # 500 verdicts, each flipped with probability 0.2 by a hash: within 4 sd (sd 0.018)
    assert abs(flips.mean() - 0.2) < 0.072, flips.mean()
    for tr in traces:  # tokens: the prompt and the reply read, one written
        r = tr.rounds[1]
        assert (r.guide.usage.input_tokens, r.guide.usage.output_tokens) == (
            tr.rounds[0].base.usage.input_tokens + 20, 1)  # fmt: skip
    # a more accurate verifier flips a subset of the same verdicts (one hash for both)
    hi, _ = import_table(src, "qa", prices, verifier=VERIFIER, simulate=0.9)
    hi_flips = [(r.guide.verdict == "yes") != r.base.correct
                for tr in hi for r in tr.rounds if r.verdict_mode == "verify"]  # fmt: skip
    assert not np.any(np.array(hi_flips) & ~flips) and sum(hi_flips) < flips.sum()
    assert flip_draw("q001", CHEAP) == flip_draw("q001", CHEAP) != flip_draw("q001", STRONG)
    stats = ccpo_ok("traces", "stats", str(out))
    assert "SIMULATED" in stats.stdout and f"{VERIFIER} verifies" in stats.stdout
    pol = tmp_path / "pol"
    res = ccpo_ok("train", "--traces", str(out), "--method", "depth-k", "--alpha", "0.2",
                  "--out", str(pol))  # fmt: skip
    assert "SIMULATED" in res.stdout
    policy = load_policy(pol)
    assert policy.provenance["simulated_verifier"]["model"] == VERIFIER
    assert "SIMULATED" in policy.guarantee_statement()


def test_a_verify_step_is_placed_after_the_step_it_checks(tmp_path: Path) -> None:
    a, b = Step(CHEAP, "cot"), Step(STRONG, "cot")
    solo_a, solo_b = LadderRound(a, a, "agree"), LadderRound(b, b, "agree")
    for rounds, why in (
        ((verify_round(a, VERIFIER), solo_b), "is not a one-model step"),
        ((solo_b, verify_round(a, VERIFIER), solo_a), "is not a one-model step"),
        ((solo_a, verify_round(a, VERIFIER)), "the last"),
    ):
        with pytest.raises(CCPOError, match=why):
            Ladder("qa", "short", rounds)
    good = Ladder("qa", "short", (solo_a, verify_round(a, VERIFIER), solo_b))
    assert good.reused(2, "base") == (1, "base") and good.reused(2, "base", 2) is None
    assert good.reused(2, "guide") is None and "verifies" in good.describe()
    # a file whose verify round follows no step of its model is refused when read
    traces, _ = import_table(table(tmp_path / "t.jsonl", 2, True), "qa", load_prices(),
                             verifier=VERIFIER)  # fmt: skip
    d = traces[0].to_json_dict()
    d["rounds"] = [d["rounds"][1], *d["rounds"][2:]]
    for k, r in enumerate(d["rounds"], start=1):
        r["round"] = k
    with pytest.raises(ValueError, match="verifies"):
        Trace.model_validate(d)
    d = traces[0].to_json_dict()
    d["rounds"][1]["guide"]["answer"] = "another reply"
    with pytest.raises(ValueError, match="returns it"):
        Trace.model_validate(d)
    # a sub-ladder keeps a verify step with the step it verifies, unless that is now last
    two = sub_ladder(traces, [CHEAP, STRONG])
    assert [(r.verdict_mode, r.base.model) for r in two[0].rounds] == [
        ("agree", CHEAP), ("verify", CHEAP), ("agree", STRONG)]  # fmt: skip
    assert ladder_of(two).T == 3 and two[0].rounds[1].guide.model == VERIFIER
    assert [r.verdict_mode for r in sub_ladder(traces, [CHEAP])[0].rounds] == ["agree"]
