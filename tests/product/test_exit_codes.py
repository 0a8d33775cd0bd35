"""Exit codes and usage errors through the real ``ccpo`` console script (a subprocess).

0 done; 1 partial or failed; 2 usage or input error, printed as one line with no traceback.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ccpo.testing import free_port
from ccpo.traces.prices import write_price_file
from tests.helpers.cli import CCPO, assert_usage_error, ccpo, user_env
from tests.helpers.world import MODELS, make_world


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["evaluat"], ["No such command 'evaluat'", "Did you mean 'evaluate'?"]),
        (["traces", "valdate", "x"], ["'validate'"]),
        (["evaluate", "--out", "o"], ["ccpo evaluate", "--traces", "ccpo evaluate --help"]),
        (["sim", "--n", "abc", "--out", "o.jsonl"], ["--n", "integer"]),
        (["sim", "--bogus", "--out", "o.jsonl"], ["No such option", "--bogus"]),
        (["sim", "--sed", "3", "--out", "o.jsonl"], ["--seed"]),
        (["train", "--steps", "-1", "--traces", "t", "--out", "o"], ["--steps"]),
        (["reproduce", "--splits", "0"], ["--splits"]),
        (["reproduce", "--steps", "0"], ["--steps"]),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv, needles, tmp_path):
    assert_usage_error(ccpo(*argv, cwd=tmp_path), *needles)


def test_input_error_exit_2_and_help_exit_0(tmp_path):
    assert_usage_error(ccpo("traces", "validate", str(tmp_path / "nope.jsonl")), "nope.jsonl")
    r = ccpo("--help")
    assert r.returncode == 0 and "reproduce" in r.stdout
    r = ccpo("--version")
    assert r.returncode == 0 and r.stdout.startswith("ccpo ")


def _collect(world, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    prices = write_price_file(tmp_path / "p.json", dict.fromkeys(MODELS, (1.0, 4.0)), "test")
    return ccpo(
        "collect", "--task", "mmlu", "--n", "3", "--rounds", "1", "--quiet", "--json",
        "--base-model", "base-m", "--base-url", world.url, "--guide-model", "guide-m",
        "--guide-url", world.url, "--prices", str(prices), "--max-retries", "0",
        "--cache", str(tmp_path / "c.sqlite"), "--out", str(tmp_path / "out.jsonl"), *extra,
    )  # fmt: skip


def test_collect_exit_0_when_complete(tmp_path):
    with make_world() as world:
        r = _collect(world, tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["complete"]


def test_collect_exit_1_when_questions_fail(tmp_path):
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as world:
        r = _collect(world, tmp_path)
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["failed"] and not summary["complete"]
    assert r.returncode == 1, r.stderr


def test_collect_exit_1_when_budget_stops_it(tmp_path):
    with make_world() as world:
        r = _collect(world, tmp_path, "--max-cost", "1e-9")
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["stopped_by_budget"] and not summary["complete"]
    assert r.returncode == 1, r.stderr


def test_help_has_no_python_types_and_marks_required():
    for cmd in ("serve", "ask", "collect", "reproduce", "evaluate", "compare", "train"):
        r = ccpo(cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert "<bool>" not in r.stdout and "list[" not in r.stdout, (cmd, r.stdout)
        assert "\\[" not in r.stdout, (cmd, r.stdout)  # no markup escapes in plain help
    assert "[required, except with --write-openapi]" in " ".join(
        ccpo("serve", "--help").stdout.split()
    )


def test_prices_show_keeps_names_and_has_json():
    from ccpo.traces.prices import load_prices

    table = load_prices()
    r = ccpo("prices", "show")  # a pipe: rich would fit the table to 80 columns
    assert r.returncode == 0
    for name in table.models:
        assert name in r.stdout, name
    r = ccpo("prices", "show", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == table.to_price_file()


def test_serve_on_a_busy_port_says_so(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = ccpo("serve", "--policy", str(tmp_path), "--port", str(port), "--task", "mmlu")
    err = assert_usage_error(r, f"cannot serve on 127.0.0.1:{port}", "--port")
    assert "http://" not in err


def test_out_onto_a_file_is_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_usage_error(ccpo("reproduce", "--out", str(f)), "is a file, not a folder")
    assert f.read_text() == "x"


def test_ask_exit_1_when_the_endpoint_fails_and_2_for_bad_input(tmp_path):
    import yaml

    from tests.helpers.policies import make_policy
    from tests.helpers.serve import deploy_values, write_prices

    policy = make_policy(tmp_path / "pol", steps=5)
    prices = write_prices(tmp_path / "p.json")
    q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as world:
        cfg = tmp_path / "d.yaml"
        cfg.write_text(yaml.safe_dump(deploy_values(world, prices, max_retries=0)))
        r = ccpo("ask", q, "--policy", str(policy), "--config", str(cfg), "--json")
        assert world.n_requests >= 1
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")
    r = ccpo("ask", q, "--policy", str(tmp_path), "--config", str(cfg))
    assert_usage_error(r, "not a trained policy folder")


def test_collect_reports_a_refused_connection(tmp_path):
    """Nothing listens on the port: each failed question says "connection refused by
    127.0.0.1:PORT" (not "timeout"), and never shows the API key of the config file."""
    import types

    import yaml

    key = "sk-test-refused-0123456789"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"base_api_key": key, "guide_api_key": key}))
    port = free_port()
    r = _collect(types.SimpleNamespace(url=f"http://127.0.0.1:{port}/v1"), tmp_path, "--config",
                 str(cfg))  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert f"connection refused by 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "timeout" not in r.stderr and "Traceback" not in r.stderr
    assert key not in r.stderr + r.stdout


def test_a_bad_value_is_blamed_on_its_flag_or_on_the_file(tmp_path):
    """A value given by flag is named by the flag (and not the YAML file); a value from the
    file is named by the file and its key (and no flag)."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("task: mmlu\nconcurrency: 4\nrounds: 2\n")
    bad.write_text("task: mmlu\nconcurrency: 0\nkappa: 3\n")
    out = ["--out", str(tmp_path / "o.jsonl")]
    err = assert_usage_error(ccpo("collect", "--config", str(good), "--concurrency", "0", *out),
                             "--concurrency 0", "greater than or equal to 1")  # fmt: skip
    assert "good.yaml" not in err
    err = assert_usage_error(ccpo("collect", "--config", str(bad), "--rounds", "3", *out),
                             "bad.yaml", "'concurrency'")  # fmt: skip
    assert "--" not in err
    err = assert_usage_error(ccpo("collect-exit", "--config", str(good), "--rounds", "0", *out),
                             "--rounds 0")  # fmt: skip
    assert "good.yaml" not in err
    ask = ["ask", "q", "--policy", str(tmp_path)]
    for flag, value in (("--kappa", "1.5"), ("--max-cost", "0")):
        err = assert_usage_error(ccpo(*ask, "--config", str(good), flag, value), flag)
        assert "good.yaml" not in err
    bad.write_text("task: mmlu\nkappa: 3\n")
    err = assert_usage_error(ccpo(*ask, "--config", str(bad), "--max-cost", "0.1"),
                             "bad.yaml", "'kappa'")  # fmt: skip
    assert "--" not in err
    serve = ["serve", "--policy", str(tmp_path), "--config", str(good), "--port", "0"]
    err = assert_usage_error(ccpo(*serve, "--rate-limit", "0"), "--rate-limit 0")
    assert "good.yaml" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--splits", "2"],
        ["train"],
        ["train", "--method", "ccpo", "--steps", "5"],
        ["compare", "--splits", "2", "--steps", "5", "--workers", "1"],
        ["reproduce", "--quick"],
    ],
    ids=["evaluate", "train-auto", "train-ccpo", "compare", "reproduce"],
)
def test_unwritable_out_is_one_line_exit_2_before_any_work(argv, sim_file, tmp_path):
    """An ``--out`` that cannot be written is refused in one line (exit 2) before any work,
    and nothing is created. Unwritable here means under a regular file (``--out afile/sub``):
    tests run as root, for whom a chmod 0o500 folder stays writable, but no one can make a
    folder inside a file. (A read-only folder fails the same probe, a nameless temporary file
    in the nearest existing folder, for a normal user.)"""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    traces = [] if argv[0] == "reproduce" else ["--traces", str(sim_file)]
    r = ccpo(*argv, *traces, "--out", str(afile / "sub"), cwd=tmp_path)
    assert_usage_error(r, f"--out {afile / 'sub'}", "is a file, not a folder")
    assert r.stdout == "", r.stdout  # refused before training or scoring anything
    assert afile.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _ccpo_with_file_size_limit(
    limit: int, *args: str, cwd: Path, home: Path
) -> subprocess.CompletedProcess:
    """``ccpo`` where no file may grow past ``limit`` bytes (RLIMIT_FSIZE; SIGXFSZ ignored, so a
    write fails with EFBIG): a full disk that root cannot write past either; ``home`` holds its
    caches (empty: a first run, whose caches cannot be written either). No bytecode is
    written (a truncated .pyc would break later runs)."""
    import resource
    import signal

    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**user_env(home), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [CCPO, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env,
        preexec_fn=limit_writes, restore_signals=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [["train", "--method", "ccpo", "--steps", "5"], ["evaluate", "--splits", "2"]],
    ids=["train", "evaluate"],
)
def test_a_failed_write_is_one_line_and_leaves_no_half_made_folder(
    argv, sim_file, tmp_path, tmp_path_factory
):
    """Files may not pass 8 kB: policy.json, features.json, prices.json and the results tables
    fit, weights.npz and the plots do not. One line, exit 1
    (the system refused: not a usage error), and no --out folder with some of the files. Run
    twice from an empty home, as on a fresh machine: matplotlib cannot save its font cache
    either (the first time nothing, then a truncated one), and says nothing of it."""
    out, home = tmp_path / "out", tmp_path_factory.mktemp("home")
    for _ in range(2):
        r = _ccpo_with_file_size_limit(8000, *argv, "--traces", str(sim_file), "--out",
                                       str(out), cwd=tmp_path, home=home)  # fmt: skip
        err = r.stderr.strip()
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, r.stderr
        assert err.startswith("error: ") and str(out) in err
        assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
