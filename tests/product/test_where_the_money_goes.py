"""``ccpo check`` says where the money goes (run through the console script's function): a
single-answer policy trained on half of a small imported trace set (the synthetic 4-model
table, 300 questions, seed 3; a cascade of pairs) and checked on the other half prints, per
rung, the share of questions paid and returned, the spend, and the spend on replies never
returned; every number equals a recomputation from the trace file itself (each reached
round's calls not stored as repeats, priced by their usage; the model of each returned step),
and the report ``--json`` prints carries the same figures unrounded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ccpo.evaluation.check import run_check
from ccpo.policies.registry import load_policy
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices
from tests.helpers.cli import ccpo_ok
from tests.helpers.routing import imported_ladder


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    d = tmp_path_factory.mktemp("money-check")
    traces, prices = imported_ladder(d, n=300, seed=3)
    lines = traces.read_text(encoding="utf-8").splitlines()
    first, second = d / "first.jsonl", d / "second.jsonl"
    first.write_text("\n".join(lines[::2]) + "\n", encoding="utf-8")
    second.write_text("\n".join(lines[1::2]) + "\n", encoding="utf-8")
    ccpo_ok("train", "--traces", str(first), "--prices", str(prices), "--method", "cstop",
            "--answer", "single", "--alpha", "0.2", "--out", str(d / "pol"))  # fmt: skip
    return d / "pol", second, prices


def recomputed(pol: Path, traces: Path, prices: Path) -> dict[str, dict[str, float]]:
    """Per model: share of questions on which its call is paid and its reply returned, and
    USD per question spent on it with and without its reply returned; from the trace file."""
    trs = read_traces(traces)
    table = load_prices(prices)
    reach, included = load_policy(pol).replay_answers(build_episodes(trs, table))
    out: dict[str, dict[str, float]] = {}
    for i, tr in enumerate(trs):
        steps = np.argwhere(included[i])  # (round, role) of the reply returned
        back = {(tr.rounds[t].base, tr.rounds[t].guide)[j].model for t, j in steps}
        for t in np.flatnonzero(reach[i]):
            for step in (tr.rounds[t].base, tr.rounds[t].guide):
                if step.reused:
                    continue
                got = out.setdefault(step.model, dict.fromkeys(("paid", "ret", "usd", "lost"), 0))
                usd = table.usage_cost(step.model, step.usage)
                got["paid"] += 1
                got["usd"] += usd
                got["ret"] += step.model in back
                got["lost"] += 0 if step.model in back else usd
    return {m: {k: v / len(trs) for k, v in got.items()} for m, got in out.items()}


ROW = re.compile(r"│\d\. (\S+) \(round \d (?:base|guide)\)\s*│\s*([\d.]+)%│\s*([\d.]+)%│"
                 r"\s*([\d.]+)│\s*([\d.]+)│")  # fmt: skip


def test_check_prints_where_the_money_goes_and_it_adds_up(checked):
    pol, traces, prices = checked
    r = ccpo_ok("check", "--policy", str(pol), "--traces", str(traces), "--prices", str(prices))
    assert "Where the money goes" in r.stdout
    rows = {m.group(1): m.groups()[1:] for m in ROW.finditer(r.stdout)}
    want = recomputed(pol, traces, prices)
    assert set(rows) == {"tiny-m", "small-m", "mid-m", "big-m"} == set(want)
    for model, (paid, ret, usd, lost) in rows.items():
        w = want[model]
        assert float(paid) == pytest.approx(100 * w["paid"], abs=0.051), model
        assert float(ret) == pytest.approx(100 * w["ret"], abs=0.051), model
        assert float(usd) == pytest.approx(w["usd"], abs=5.1e-7), model
        assert float(lost) == pytest.approx(w["lost"], abs=5.1e-7), model
    lost = sum(w["lost"] for w in want.values())
    assert lost > 0  # the case: some replies are paid for and not returned
    assert f"${lost:.6f} per question" in r.stdout and "never returned" in r.stdout

    money = run_check(pol, traces, [prices])[0].to_json()  # what --json prints
    assert [x["model"] for x in money["money"]["rungs"]] == ["tiny-m", "small-m", "mid-m", "big-m"]
    for x in money["money"]["rungs"]:
        assert x["paid"] == pytest.approx(want[x["model"]]["paid"], abs=1e-12)
        assert x["unreturned_usd_per_question"] == pytest.approx(want[x["model"]]["lost"])
    assert money["money"]["unreturned_usd_per_question"] == pytest.approx(lost)
    assert money["money"]["usd_per_question"] == pytest.approx(money["cost_usd_per_question"])


def test_result_rows_say_where_their_money_goes(sim_file, tmp_path):
    """``ccpo evaluate`` (the harness and result files ``compare`` uses) on SYNTHETIC
    judge-ladder traces (ccpo.traces.sim: 2T rungs, every step its own call): every row but
    the oracle bound carries ``money`` in results.json; its rungs' spend, plus the
    LLM-as-policy's own calls ("other"), is the row's cost; results.md and the terminal
    hold the table."""
    out = tmp_path / "eval"
    names = ["base", "cstop-single", "llm-policy:sim-guide", "oracle"]
    r = ccpo_ok("evaluate", "--traces", str(sim_file), "--alpha", "0.2", "--splits", "3",
                "--out", str(out), *[a for n in names for a in ("--policy", n)])  # fmt: skip
    doc = json.loads((out / "results.json").read_text())
    n_test = doc["sizes"]["test"]
    assert [row["policy"] for row in doc["rows"]] == names
    for row in doc["rows"]:
        money = row.get("money")
        assert (money is None) == (row["policy"] == "oracle"), row["policy"]
        if money is None:
            continue
        assert len(money["rungs"]) == 2 * 4  # T = 4 judge rounds
        spend = sum(x["usd_per_question"] for x in money["rungs"])
        total = (spend + money["other_usd_per_question"]) * 100 * n_test
        assert total == pytest.approx(row["cost_cents"], rel=1e-9), row["policy"]
        assert (money["other_usd_per_question"] > 0) == row["policy"].startswith("llm-policy")
        assert all(x["returned"] <= x["paid"] for x in money["rungs"])
    base = doc["rows"][0]["money"]["rungs"]  # round 1's base, returned: round 1's guide paid
    assert [(x["paid"], x["returned"]) for x in base[:3]] == [(1, 1), (1, 0), (0, 0)]
    for text in ((out / "results.md").read_text(), r.stdout):
        assert "Where the money goes" in text and "Never returned" in text
