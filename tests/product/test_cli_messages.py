"""What the command line says when something is off, through the real ``ccpo`` script (a
subprocess): each error or warning names what is wrong and what fixes it (data too small to
calibrate, models without a price, a policy and traces that do not match, a table given as
traces, a mistyped key, flag or state URL, a busy port), and never a secret. What a test only
sets up or runs to success (the policy trained, a fixed command) runs the script's function in
this process (``tests.helpers.cli.ccpo_in``).

The HTTP ones (``ccpo replay-server`` / ``ccpo serve`` refusing bad requests, upstream errors)
are in ``tests/runtime/test_request_errors.py`` and ``tests/runtime/test_upstream_errors.py``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ccpo.traces.io import read_traces, write_traces
from ccpo.traces.sim import SimConfig, generate
from tests.helpers.cli import assert_usage_error, ccpo, ccpo_in, ccpo_ok

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CSV = ROOT / "docs" / "examples" / "import-example.csv"


@pytest.fixture(scope="module")
def sim4(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "sim4.jsonl"
    write_traces(path, generate(SimConfig(n=300, seed=3)))
    return path


@pytest.fixture(scope="module")
def policy4(sim4, tmp_path_factory) -> Path:
    """A CStop-LR policy (T = 4) trained by ``ccpo train`` on the synthetic set (about 2 s)."""
    out = tmp_path_factory.mktemp("pol") / "cstop"
    ccpo_ok("train", "--traces", str(sim4), "--method", "cstop-lr", "--out", str(out))
    return out


def test_one_trace_is_singular(tmp_path):
    write_traces(tmp_path / "one.jsonl", generate(SimConfig(n=1, seed=1)))
    r = ccpo("traces", "validate", str(tmp_path / "one.jsonl"))
    assert "1 trace," in r.stdout and "1 traces" not in r.stdout, r.stdout


# ----------------------------------------------------------------------------- tiny data
def test_training_on_tiny_data_says_it_is_too_small_and_what_it_takes(tmp_path):
    """5 questions leave 2 calibration questions (train calibrates on every question outside
    its 5:1:1 training split): at α = 0.1 split conformal needs ⌊α(n+1)⌋ ≥ 1, n ≥ 9
    calibration questions, 35 questions in all; at α = 0.2, 4 and 14. The degenerate-policy
    warning then blames the data, not --steps."""
    tiny = tmp_path / "tiny.jsonl"
    write_traces(tiny, generate(SimConfig(n=5, seed=1)))
    for alpha, need, total in (("0.1", 9, 35), ("0.2", 4, 14)):
        r = ccpo("train", "--traces", str(tiny), "--alpha", alpha, "--auto-ccpo-steps", "20",
                 "--out", str(tmp_path / alpha))  # fmt: skip
        assert r.returncode == 0, r.stderr
        err = " ".join(r.stderr.split())
        assert "too small" in err and "2 calibration questions" in err, err
        assert f"at least {need} " in err and f"at least {total} questions" in err, err
        assert "try more --steps" not in err, err
        out = " ".join(r.stdout.split())
        assert "on 3 questions" in out and "on 2 questions" in out, out
    # at α = 0.5 two calibration questions are enough: ⌊0.5 · 3⌋ = 1
    r = ccpo("train", "--traces", str(tiny), "--alpha", "0.5", "--auto-ccpo-steps", "20",
             "--out", str(tmp_path / "ok"))  # fmt: skip
    assert r.returncode == 0 and "too small" not in r.stderr, r.stderr


# ----------------------------------------------------------------------------- prices
def test_every_model_without_a_price_is_named_at_once(sim4, tmp_path):
    traces = read_traces(sim4)[:30]
    for tr in traces:
        for t, r in enumerate(tr.rounds):
            r.base.model, r.guide.model = f"mine-{t}", "their-guide"
    path = tmp_path / "unpriced.jsonl"
    write_traces(path, traces)
    names = ["mine-0", "mine-1", "mine-2", "mine-3", "their-guide"]
    for argv in (["train", "--traces", str(path), "--out", str(tmp_path / "p")],
                 ["traces", "stats", str(path)]):  # fmt: skip
        err = assert_usage_error(ccpo(*argv), *names)
        assert "no price for models" in err and "--prices" in err
    fix = {"as_of": "2026-11-25", "source": "test", "models": {
        m: {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0} for m in names}}  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(fix))
    r = ccpo_in("traces", "stats", str(path), "--prices", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr  # one price file fixes them all


# ----------------------------------------------------------------------------- dry-run
def test_dry_run_names_the_task_or_rounds_mismatch_first(policy4, sim4, tmp_path):
    mmlu = ROOT / "src" / "ccpo" / "data" / "traces" / "mmlu-public.jsonl.gz"
    err = assert_usage_error(ccpo("dry-run", "--policy", str(policy4), "--traces", str(mmlu)),
                             "task", "'mmlu'")  # fmt: skip
    assert "has no endpoint" not in err
    three = tmp_path / "three.jsonl"
    write_traces(three, generate(SimConfig(n=40, rounds=3, seed=3)))
    r = ccpo("dry-run", "--policy", str(policy4), "--traces", str(three))
    err = assert_usage_error(r, "horizon = 4", "horizon = 3")
    assert "ValueError" not in r.stderr
    own = ccpo_in("dry-run", "--policy", str(policy4), "--traces", str(sim4), "--n", "5")
    assert own.returncode == 0, own.stderr
    assert "warning" not in own.stderr, own.stderr  # its own (synthetic) file: nothing to say


# ----------------------------------------------------------------------------- a table
@pytest.mark.parametrize("argv", [["train", "--out", "p"], ["evaluate", "--out", "e"]])
def test_a_table_given_as_traces_points_to_traces_import(argv, tmp_path):
    jsonl = tmp_path / "table.jsonl"
    import csv

    with open(EXAMPLE_CSV, newline="", encoding="utf-8") as fh:
        jsonl.write_text("".join(json.dumps(row) + "\n" for row in csv.DictReader(fh)))
    for table in (EXAMPLE_CSV, jsonl):
        err = assert_usage_error(ccpo(*argv[:1], "--traces", str(table), *argv[1:], cwd=tmp_path),
                                 f"{table.name}:1", "ccpo traces import")  # fmt: skip
        assert "not ccpo.trace/v1 traces" in err
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json at all\n")
    err = assert_usage_error(ccpo("traces", "validate", str(junk)), "malformed JSON")
    assert "traces import" not in err  # only a file that looks like a table gets the hint


# ----------------------------------------------------------------------------- names
def test_a_mistyped_yaml_key_gets_a_did_you_mean(policy4, tmp_path):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text('max_cost_totl: 3\nendpoints:\n  "*": {uurl: http://127.0.0.1:9/v1}\n'
                   "server:\n  stat: s.sqlite\n")  # fmt: skip
    r = ccpo("serve", "--policy", str(policy4), "--config", str(cfg))
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, r.stderr  # every key, one line
    for needle in ("typo.yaml", "unknown settings",
                   "'max_cost_totl' (did you mean 'max_cost_total'?)",
                   "'server.stat' (did you mean 'server.state'?)",
                   "'endpoints.*.uurl' (did you mean 'endpoints.*.url'?)"):  # fmt: skip
        assert needle in err, (needle, err)


@pytest.mark.parametrize("cmd", ["train", "compare", "evaluate", "reproduce"])
def test_alpha_out_of_range_names_its_flag(cmd, sim4, tmp_path):
    argv = [cmd, "--alpha", "1.5", "--out", str(tmp_path / "o")]
    if cmd != "reproduce":
        argv += ["--traces", str(sim4)]
    assert_usage_error(ccpo(*argv), "--alpha", "1.5", "(0, 1)")
    assert not (tmp_path / "o").exists()


def test_a_bad_state_names_the_state_flag_and_never_its_password(policy4, tmp_path):
    serve = ["serve", "--policy", str(policy4), "--endpoints", '{"*": {url: http://h/v1}}']
    err = assert_usage_error(ccpo(*serve, "--state", "mysql://db/x"), "--state", "'mysql://'")
    assert "server.state" not in err
    err = assert_usage_error(ccpo(*serve, "--state", "postgresql://ccpo:hunter2@db:5432/c"),
                             "--state", "password", "$PGPASSWORD")  # fmt: skip
    assert "hunter2" not in err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  state: mysql://db/x\n")
    err = assert_usage_error(ccpo(*serve, "--config", str(cfg)), "c.yaml", "'server.state'")
    assert "--state" not in err


def test_replay_server_busy_port_hint_names_only_port(sim4):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = ccpo("replay-server", "--traces", str(sim4), "--port", str(port))
    err = assert_usage_error(r, f"cannot serve on 127.0.0.1:{port}", "--port")
    assert "server.port" not in err


# ----------------------------------------------------------------------------- endpoints
def test_endpoints_flag_help_shows_its_form(policy4):
    for cmd in ("ask", "serve"):
        out = " ".join(ccpo(cmd, "--help").stdout.split())
        assert "--endpoints YAML" in out and "dict[" not in out and "EndpointSpec" not in out
        assert """'{"*": {url: http://127.0.0.1:9000/v1}}'""" in out, out
    err = assert_usage_error(
        ccpo("ask", "q", "--policy", str(policy4), "--endpoints", '{"*": {ur: http://h/v1}}'),
        "--endpoints", "did you mean 'endpoints.*.url'",
    )  # fmt: skip
    assert "valid dictionary" not in err
    assert_usage_error(ccpo("ask", "q", "--policy", str(policy4), "--endpoints", "{"),
                       "--endpoints", "not YAML or JSON")  # fmt: skip
