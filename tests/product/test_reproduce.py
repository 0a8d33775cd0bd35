"""`ccpo reproduce --quick` end to end on the bundled real trace set: the report's tables,
flags and ratios must be the numbers in results.json; the summary across sets opens it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ccpo.cli import main
from ccpo.evaluation.reproduce import bundled_sets, resolve_data
from ccpo.evaluation.seeds import Group, Section, ratio_lines, seed_ratio_lines, seed_summary
from ccpo.report.plots import frontier_points
from ccpo.report.reproduce import headline, kappa_notes, spread_line

ROW = re.compile(r"^\| (?:\*\*)?(\S+?)(?: ★\*\*)? \| (.+) \|$", re.M)


def _table(text: str) -> dict[str, list[str]]:
    """Policy → cells of the Markdown table rows in ``text`` (header row left out)."""
    rows = {m.group(1): m.group(2).split(" | ") for m in ROW.finditer(text)}
    rows.pop("Policy", None)
    return rows


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce")
    # --quick with fewer training steps: this checks the report against results.json and the
    # batch-calibrated coverage, neither of which depends on how long the policies trained
    # one set (mmlu-public ships too): the checks below are per set
    argv = ["reproduce", "--quick", "--steps", "50", "--data", "hotpotqa-public"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def _results(run: Path, a: str, name: str = "hotpotqa-public") -> dict:
    return json.loads((run / name / f"alpha-{a}" / "results.json").read_text())


def _expected_best(rows: list[dict], alpha: float) -> str:
    """The cheapest method at the target (not the oracle bound, not the always-<model> row)."""
    ok = [
        r
        for r in rows
        if r["policy"] != "oracle"
        and not r["policy"].startswith("always-")
        and round(r["coverage"], 3) >= 1 - alpha
    ]
    return min(ok, key=lambda r: r["cost_cents"])["policy"]


def _cov_cell(coverage: float, alpha: float, n_test: int) -> str:
    """A coverage as the tables print it: ✗ beyond 2 standard errors of a test split's
    coverage, "(within noise)" for a smaller shortfall."""
    text = f"{coverage:.3f}"
    if round(coverage, 3) >= round(1 - alpha, 3):
        return text
    se = (alpha * (1 - alpha) / n_test) ** 0.5
    return text + (" ✗" if (1 - alpha) - coverage > 2 * se else " (within noise)")


def test_bundled_sets_are_discovered(tmp_path):
    # reproduce with no --data runs every bundled set
    assert {"hotpotqa-public", "mmlu-public"} <= set(resolve_data(None)) == set(bundled_sets())
    # a set dropped into the folder is found without code
    for f in bundled_sets()["hotpotqa-public"].parent.iterdir():
        if f.name.startswith("hotpotqa-public"):
            shutil.copy(f, tmp_path / f.name.replace("hotpotqa-public", "other-set"))
    (tmp_path / "notes.md").write_text("not a set")
    assert list(bundled_sets(tmp_path)) == ["other-set"]


def test_report_files_exist(quick_run):
    for name in ("report.md", "report.html", "reproduce.json", "hotpotqa-public/frontier.png"):
        assert (quick_run / name).is_file(), name
    for a in ("0.1", "0.2"):
        folder = quick_run / "hotpotqa-public" / f"alpha-{a}"
        for f in ("results.json", "results.md", "results.csv", "box_coverage.png",
                  "box_cost.png", "training_curves.png"):  # fmt: skip
            assert (folder / f).is_file(), f
    page = (quick_run / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 * 3 + 1
    assert "<pre>" not in page and "<table>" in page


def test_section_tables_match_results_json(quick_run):
    md = (quick_run / "report.md").read_text()
    sections = md.split("### hotpotqa-public, α = ")[1:]
    assert len(sections) == 2
    for sec, a in zip(sections, ("0.1", "0.2"), strict=True):
        alpha = float(a)
        res = _results(quick_run, a)
        assert res["alpha"] == alpha and res["splits"] == 20
        n_test = res["sizes"]["test"]
        strongest = "always-gpt-3.5-turbo-instruct"
        assert (
            f"| Cost (¢ per test split of {n_test} q.) | Cost / oracle | Cost / {strongest} |"
        ) in sec
        assert f"Coverage (target ≥ {1 - alpha:.2f})" in sec
        table = _table(sec.split("\n\n#")[0])
        by = {r["policy"]: r for r in res["rows"]}
        assert set(table) == set(by)
        for p in ("ccpo", "cpo-batch", "cpo-online", "uala", "oracle", "ccpo-lam0.5"):
            assert p in by
        floor = by["oracle"]["cost_cents"]
        best = _expected_best(res["rows"], alpha)
        assert f"| **{best} ★** |" in sec
        always = by[strongest]["cost_cents"]
        for name, r in by.items():
            cost, rel, rel_always, cov, length, size, latency = table[name]
            assert latency == f"{r['latency_s']:.2f}"  # the estimated latency beside the cost
            assert cost == f"{r['cost_cents']:.3f}" and rel == f"{r['cost_cents'] / floor:.2f}×"
            assert rel_always == f"{r['cost_cents'] / always:.2f}×"
            want = (
                f"{r['coverage']:.3f}"
                if name == "oracle"
                else _cov_cell(r["coverage"], alpha, n_test)
            )
            assert cov == want
            assert length == f"{r['avg_len']:.2f}" and size == f"{r['set_size']:.2f}"
        for line in ratio_lines(res["rows"], alpha):
            assert f"- {line}" in sec
            ours, rest = line.split(" / ")
            base, ratio = rest.split(": ")[0], float(rest.split(": ")[1].split()[0])
            assert ratio == pytest.approx(by[ours]["cost_cents"] / by[base]["cost_cents"], abs=6e-4)
            for side in (ours, base):
                missed = round(by[side]["coverage"], 3) < 1 - alpha
                assert (f"{side} misses the target" in line) == missed


def test_summary_opens_the_report(quick_run):
    md = (quick_run / "report.md").read_text()
    head, rest = md.split("## Summary across sets", 1)
    assert "### " not in head  # nothing per-set comes before the summary
    summary = rest.split("\n## ")[0]
    cells = _table(summary)
    assert "oracle" not in cells
    for j, a in enumerate(("0.1", "0.2")):
        alpha = float(a)
        res = _results(quick_run, a)
        by = {r["policy"]: r for r in res["rows"]}
        n_test, floor = res["sizes"]["test"], by["oracle"]["cost_cents"]
        assert (
            f"hotpotqa-public, α = {a}: cost / oracle · coverage (target ≥ {1 - alpha:.2f}; "
            f"oracle {floor:.2f}¢ per split of {n_test} q.)"
        ) in summary
        best = _expected_best(res["rows"], alpha)
        for name, row in cells.items():
            r = by[name]
            want = f"{r['cost_cents'] / floor:.2f}× · " + _cov_cell(r["coverage"], alpha, n_test)
            want = f"**{want} ★**" if name == best else want
            assert row[j] == want, (name, a)
        assert f"hotpotqa-public, α = {a}: cheapest at the target is {best}," in summary
    assert "ONE seed" in summary and "--seed 0 --seed 1 --seed 2" in summary
    page = (quick_run / "report.html").read_text()
    assert page.count("class='miss'") == md.count("✗") - 1  # the legend line has one
    assert page.count("class='miss'") > 0


@pytest.mark.slow
def test_conformal_rows_cover_on_real_data(quick_run):
    """Batch-calibrated rows keep mean coverage ≥ 1 − α − 0.02 over the 20 quick splits."""
    for a in (0.1, 0.2):
        for r in _results(quick_run, f"{a:g}")["rows"]:
            if r["policy"] in ("ccpo", "cpo-batch") or r["policy"].startswith("ccpo-lam"):
                assert r["coverage"] >= 1 - a - 0.02, r["policy"]


def _section(seed: int, rows: dict[str, tuple[float, float]], **kw) -> Section:
    return Section(
        "set", 0.1, Path("."), {"rows": [
            {"policy": p, "cost_cents": c, "coverage": v} for p, (c, v) in rows.items()
        ]}, seed, **kw,
    )  # fmt: skip


def test_seed_summary_and_ratios():
    a = _section(0, {"ccpo": (8.0, 0.90), "cpo-batch": (10.0, 0.91), "uala": (0.0, 0.8),
                     "oracle": (4.0, 0.9)})  # fmt: skip
    b = _section(1, {"ccpo": (12.0, 0.88), "cpo-batch": (10.0, 0.92), "uala": (0.0, 0.8),
                     "oracle": (5.0, 0.9)})  # fmt: skip
    rows = {r["policy"]: r for r in seed_summary([a, b])}
    assert rows["ccpo"]["cost_cents"] == pytest.approx(10.0)
    assert rows["ccpo"]["cost_sd"] == pytest.approx(2**0.5 * 2)  # sd of (8, 12), ddof 1
    assert rows["ccpo"]["rel"] == pytest.approx((8 / 4 + 12 / 5) / 2)
    assert rows["ccpo"]["coverage"] == pytest.approx(0.89)
    assert rows["ccpo"]["coverage_min"] == pytest.approx(0.88)
    assert rows["ccpo"]["misses"] == 1 and rows["cpo-batch"]["misses"] == 0
    assert rows["cpo-batch"]["cost_sd"] == 0.0 and rows["ccpo"]["seeds"] == 2
    # a zero-cost baseline gives no ratio; a seed that misses the target is named
    assert seed_ratio_lines([a, b]) == [
        "ccpo / cpo-batch: mean 1.000 (seeds: 0.800, 1.200; ccpo misses the target in seed 1)"
    ]


def test_kappa_collapse_is_said():
    s = _section(0, {"ccpo": (8.0, 0.9)}, kappa_online={"ccpo": 1.6e-9, "cpo": 0.2})
    notes = kappa_notes(s)
    assert len(notes) == 1 and notes[0].startswith("ccpo: the online κ collapsed to 1.6e-09")


def test_frontier_names_coinciding_policies():
    a = _section(0, {"guide": (6.2, 0.68), "cpo": (6.2, 0.68), "ccpo": (8.0, 0.9)})
    b = _section(0, {"guide": (6.2, 0.68), "cpo": (6.3, 0.70), "ccpo": (7.0, 0.8)})
    assert [n for n, _ in frontier_points([a])] == [["guide", "cpo"], ["ccpo"]]
    assert [n for n, _ in frontier_points([a, b])] == [["guide"], ["cpo"], ["ccpo"]]


def test_every_set_and_two_seeds_end_to_end(tmp_path, sim_file):
    """Two sets (the bundled one and a synthetic file) and two seeds: one summary table with a
    column per set, mean ± sd across seeds, and the measured seed-to-seed spread."""
    out = tmp_path / "r"
    args = ["reproduce", "--quick", "--steps", "20", "--splits", "5", "--alpha", "0.1"]
    args += ["--data", "hotpotqa-public", "--data", str(sim_file), "--out", str(out)]
    assert main([*args, "--seed", "0", "--seed", "1"]) == 0
    assert json.loads((out / "reproduce.json").read_text())["seeds"] == [0, 1]
    res = [
        json.loads(
            (out / "hotpotqa-public" / "alpha-0.1" / f"seed-{s}" / "results.json").read_text()
        )
        for s in (0, 1)
    ]
    assert [r["seed"] for r in res] == [0, 1]
    md = (out / "report.md").read_text()
    summary = md.split("## Summary across sets")[1].split("\n## ")[0]
    assert "hotpotqa-public, α = 0.1: cost / oracle" in summary
    assert "sim, α = 0.1: cost / oracle" in summary
    assert "± is the sd across 2 seeds" in summary
    assert "hotpotqa-public, α = 0.1, across seeds 0, 1" in md
    costs = [{r["policy"]: r["cost_cents"] for r in x["rows"]}["ccpo"] for x in res]
    m = re.search(r"^\| (?:\*\*)?ccpo(?: ★\*\*)? \| ([\d.]+) ± ([\d.]+) \|", md, re.M)
    assert m and float(m.group(1)) == pytest.approx(sum(costs) / 2, abs=6e-4)
    assert "### hotpotqa-public, α = 0.1, seed 1" in md and "## sim" in md


def test_headline_says_who_by_how_much_and_how_sure():
    rows = {"ccpo": (8.0, 0.91), "auto": (8.0, 0.92), "cpo-batch": (10.0, 0.95),
            "uala": (5.0, 0.85), "oracle": (4.0, 0.9)}  # fmt: skip
    one = Group("set", 0.1, [_section(0, rows)])
    assert headline(one).startswith(
        "set, α = 0.1: cheapest at the target is ccpo, 2.00× the oracle floor, tied with auto"
    )
    other = dict(rows, ccpo=(12.0, 0.88))  # seed 1: ccpo misses and costs more
    two = Group("set", 0.1, [_section(0, rows), _section(1, other)])
    line = headline(two)
    assert "cheapest at the target is auto" in line and "20% cheaper than the next" in line
    assert "means over 2 seeds; cheapest at the target in 1 of 2 seeds" in line
    assert "ONE seed" in spread_line([one]) and "sd across 2 seeds" in spread_line([two])


def test_report_leads_with_the_saving(quick_run):
    """The report opens with the saving against always calling the strongest model, in
    words, and states the prices (with the stand-in) the figures use."""
    md = (quick_run / "report.md").read_text()
    assert md.index("## The saving") < md.index("## Summary across sets") < md.index("### ")
    strongest = "always-gpt-3.5-turbo-instruct"
    for a in ("0.1", "0.2"):
        res = _results(quick_run, a)
        by = {r["policy"]: r for r in res["rows"]}
        best = _expected_best(res["rows"], float(a))
        share = by[best]["cost_cents"] / by[strongest]["cost_cents"]
        floor = by["oracle"]["cost_cents"]
        assert (
            f"hotpotqa-public, α = {a}: {best} costs {share:.0%} of {strongest} at coverage "
            f"{by[best]['coverage']:.3f}, {by[best]['cost_cents'] / floor:.2f}× the oracle floor "
            f"({strongest} alone: coverage {by[strongest]['coverage']:.3f})"
        ) in md
        assert res["against"] == "gold"
        assert res["prices"]["gpt-3.5-turbo-instruct"]["input_usd_per_mtok"] == 2.5
        single = [r for r in res["rows"] if r["policy"].endswith("-single")]
        assert {r["policy"] for r in single} == {"cstop-single", "auto-single"}
        assert all(r["set_size"] == 1 and r["extra"]["answer"] == "single" for r in single)
    assert "gpt-3.5-turbo-instruct: 2.5 / 10 — GPT-4o list price, standing in" in md
