"""The command line's help, through the real ``ccpo`` script (a subprocess): a group without
a command prints its help whole, the main job's commands come first, ``train`` puts its basic
options first, and the README agrees with the help; and no Sphinx markup shows in any
command's help (the text of its docstrings, read through the console script's function in
this process: ``tests.helpers.cli.ccpo_in``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ccpo.policies.registry import METHODS
from tests.helpers.cli import ccpo, ccpo_in

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = ("reproduce", "train", "compare", "evaluate", "ask", "serve", "dry-run",
            "replay-server", "collect", "collect-exit", "sim")  # fmt: skip


# ----------------------------------------------------------------------------- no command
@pytest.mark.parametrize(
    ("argv", "usage"),
    [((), "Usage: ccpo [OPTIONS] COMMAND"), (("traces",), "Usage: ccpo traces [OPTIONS]")],
)
def test_a_group_without_a_command_prints_its_help_whole(argv, usage):
    """``ccpo`` / ``ccpo traces`` alone: the help as ``--help`` prints it (one option or
    command per line), on stderr, exit 2 (click's convention since 8.2: a usage error), not
    squashed into one ``error:`` line."""
    r = ccpo(*argv)
    assert r.returncode == 2
    assert not r.stderr.startswith("error:"), r.stderr
    assert r.stderr.splitlines()[0].startswith(usage)
    helped = ccpo(*argv, "--help")
    assert helped.returncode == 0 and r.stderr.strip() == helped.stdout.strip()
    assert len(r.stderr.splitlines()) > 8


# ----------------------------------------------------------------------------- help text
def test_commands_are_listed_main_job_first_sim_last():
    out = ccpo("--help").stdout
    listed = re.findall(r"^  ([a-z-]+)\s{2,}", out.split("Commands:")[1], re.M)
    assert listed[:4] == ["reproduce", "train", "compare", "evaluate"], listed
    assert listed[-1] == "sim" and listed.index("ask") < listed.index("collect"), listed


@pytest.mark.parametrize("cmd", [*COMMANDS, "traces import", "traces stats", "prices show"])
def test_help_has_no_sphinx_markup(cmd):
    r = ccpo_in(*cmd.split(), "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"Usage: ccpo {cmd} "), r.stderr
    assert not re.search(r":(mod|func|class|meth|attr):`|``", r.stdout), r.stdout


def test_train_help_puts_the_basic_options_first_and_the_knobs_in_panels():
    out = ccpo("train", "--help").stdout
    sections = re.findall(r"^(\S[^\n]*):$", out, re.M)
    assert sections[0] == "Options", sections
    assert any(s.startswith("Training") for s in sections[1:]), sections
    assert any(s.startswith("Fitting") for s in sections[1:]), sections
    basic = out.split("\nOptions:\n")[1].split("\n\n")[0]
    for flag in ("--traces", "--out", "--method", "--alpha", "--seed", "--force"):
        assert flag in basic, flag
    for knob in ("--critic-lr", "--damping", "--max-leaf-nodes"):
        assert knob not in basic and knob in out, knob


def test_readme_and_help_agree_on_quick_and_list_every_method():
    quick = re.search(r"--quick[^\n]*\n?[^\n]*?(\d+) s measured", README)
    assert quick, "the README gives --quick's measured time"
    help_ = " ".join(ccpo("reproduce", "--help").stdout.split())
    assert f"{quick.group(1)} s measured" in help_, help_
    train_row = next(line for line in README.splitlines() if line.startswith("| `ccpo train"))
    for name in METHODS:
        assert name in train_row, name


def test_readme_deploy_block_writes_its_config_before_using_it():
    block = README.split("From a table of your models' answers to a live router:")[1]
    block = block.split("```bash\n")[1].split("```")[0]
    used = [i for i, line in enumerate(block.splitlines()) if "--config dry-run.yaml" in line]
    written = [i for i, line in enumerate(block.splitlines()) if "> dry-run.yaml" in line]
    assert used and written and written[0] < used[0], block
