"""A policy that fails on the traces it is run on (here: a folder whose stopping model was
fitted on other columns than its features.json names, as after copying files between two
folders) ends ``ccpo check`` and ``ccpo dry-run`` in one line that names what failed and why,
exit 2, never a traceback; ``--debug`` still shows it."""

from __future__ import annotations

import shutil

import pytest

from ccpo.testing.ladder_table import write_ladder_table
from tests.helpers.cli import assert_usage_error, ccpo, ccpo_ok


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory):
    d = tmp_path_factory.mktemp("one-line")
    table, prices = write_ladder_table(d, n=200, seed=0, labels=False)
    common = ("--task", "medqa", "--family", "mcq", "--prices", str(prices))
    ccpo_ok("traces", "import", str(table), *common, "--signals", "similarity,length",
            "--out", str(d / "signals.jsonl"))  # fmt: skip
    ccpo_ok("traces", "import", str(table), *common, "--out", str(d / "plain.jsonl"))
    for name in ("signals", "plain"):
        ccpo_ok("train", "--traces", str(d / f"{name}.jsonl"), "--method", "cstop",
                "--alpha", "0.2", "--out", str(d / f"pol-{name}"))  # fmt: skip
    # the plain policy's folder with the stopping model of the one that reads signals
    shutil.copy(d / "pol-signals" / "model.pkl", d / "pol-plain" / "model.pkl")
    return d


@pytest.mark.parametrize("command", ["check", "dry-run"])
def test_a_failing_policy_is_one_line(mismatched, command) -> None:
    d = mismatched
    args = (command, "--policy", str(d / "pol-plain"), "--traces", str(d / "plain.jsonl"))
    err = assert_usage_error(ccpo(*args), "pol-plain", "failed (ValueError: ", "--debug")
    assert "plain.jsonl" in err
    debug = ccpo("--debug", *args)
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # where, when asked
