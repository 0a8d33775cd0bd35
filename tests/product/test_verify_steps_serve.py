"""A ladder with verify steps goes from import to a served answer as any other: ``traces
import --verifier`` (verdicts SIMULATED at accuracy 0.85, by a verifier model that is not one
of the table's) writes the verifier's price beside the traces with the ladder's, so ``train``
needs no ``--prices``; ``train`` (a routed single answer, certified by Pareto testing, or a
set) succeeds, ``dry-run`` finds every live answer, verify steps included, equal to the
policy's replay, and ``check`` says where the money goes, the verifier's rung named.

Tables are SYNTHETIC (:mod:`tests.helpers.families`: the ``chat`` family, free text, where a
verdict is what a reply's own signals lack; and ``short``); not LLM output. The commands run
in this process through ``ccpo.cli.main``, the console script's function. Kept apart from
the documented-combination matrix (which has no verify steps)."""

from __future__ import annotations

import json

import pytest

from ccpo.cli import main
from ccpo.traces.io import read_traces
from ccpo.traces.prices import read_price_file, write_price_file
from tests.helpers.families import MODELS, import_args, write_family_table

pytestmark = pytest.mark.slow

VERIFIER = "judge-v"  # priced in the import's --prices only, not a model of the table
N, ASKED = 66, 24  # as the matrix: 48 train (two folds for τ), 18 calibrate


@pytest.mark.parametrize(
    ("family", "route", "answer"), [("chat", True, "single"), ("short", False, "set")]
)
def test_verify_steps_train_dry_run_and_check(tmp_path, capsys, family, route, answer) -> None:
    table, _ = write_family_table(tmp_path, family, N)
    prices = write_price_file(
        tmp_path / "with-verifier.json",
        {**{m: (i, o) for m, _, i, o in MODELS}, VERIFIER: (0.5, 2.0)},
        "synthetic (tests)",
    )
    traces = tmp_path / "traces.jsonl"
    args = import_args(family, table, prices, traces, signals=family == "chat")
    assert main([*args, "--verifier", VERIFIER, "--simulate-verifier", "0.85"]) == 0
    side = read_price_file(tmp_path / "traces.prices.json")
    assert sorted(side.models) == sorted([*(m for m, *_ in MODELS), VERIFIER])
    modes = [r.verdict_mode for r in read_traces(traces)[0].rounds]
    assert modes == ["agree", "verify"] * 3 + ["agree"]  # after each step but the last
    policy = tmp_path / "policy"
    train = ["train", "--traces", str(traces), "--method", "cstop-lr", "--answer", answer,
             "--alpha", "0.2", "--out", str(policy), *(["--route"] if route else [])]  # fmt: skip
    assert main(train) == 0, capsys.readouterr().err  # no --prices: read beside the traces
    if route:
        assert json.loads((policy / "route.json").read_text())["sequence"]  # Pareto testing
    capsys.readouterr()
    dry = ["dry-run", "--policy", str(policy), "--traces", str(traces), "--n", str(ASKED)]
    assert main(dry) == 0, capsys.readouterr()
    said = " ".join(capsys.readouterr().out.split())
    assert f"{ASKED}/{ASKED} answer sets equal the policy's replay" in said, said
    main(["check", "--policy", str(policy), "--traces", str(traces), "--json"])
    money = json.loads(capsys.readouterr().out)["money"]
    verifiers = [r for r in money["rungs"] if r.get("verifies")]
    assert [r["model"] for r in verifiers] == [VERIFIER] * 3
    assert all(r["returned"] == 0 for r in verifiers)  # a verdict is never returned
    assert money["verdict_usd_per_question"] == pytest.approx(
        sum(r["usd_per_question"] for r in verifiers)
    )
