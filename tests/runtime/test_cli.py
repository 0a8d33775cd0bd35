"""``ccpo ask`` and ``ccpo serve`` as commands (subprocesses over real HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from ccpo.cli import main
from ccpo.testing import free_port, wait_for_http

from .conftest import deploy_values, state_at

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
ENV = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def _config(tmp_path: Path, world, prices: Path, **kw) -> Path:
    import yaml

    p = tmp_path / "deploy.yaml"
    p.write_text(yaml.safe_dump(deploy_values(world, prices, **kw)))
    return p


def _start_serve(policy, cfg, port: int, *flags: str, env=ENV):
    """``ccpo serve`` through the real entry point on 127.0.0.1:``port``; returns the process
    and its URL once /healthz answers (the process is killed if it never does)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy),
         "--config", str(cfg), "--port", str(port), *flags, "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/healthz", proc, 90, "ccpo serve")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=20)
        raise
    return proc, url


def test_ask_json_matches_serve(world, any_policy_dir, prices_path, tmp_path):
    cfg = _config(tmp_path, world, prices_path)
    port = free_port()
    state = state_at(tmp_path, "state.sqlite")
    proc, url = _start_serve(any_policy_dir, cfg, port, "--state", state)
    try:
        api = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=30).json()
        out = subprocess.run(
            [sys.executable, "-m", "ccpo", "ask", Q, "--policy", str(any_policy_dir),
             "--config", str(cfg), "--json"],
            env=ENV, capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        cli = json.loads(out)
        for d in (api, cli):
            d.pop("id")
            d.pop("latency_ms")
        assert cli == api
        assert httpx.get(url + "/metrics.json").json()["requests"] == 1  # in the state
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert f"ccpo serve: {any_policy_dir.name} (T = 4" in err  # the variant served


def test_ask_human_output(world, policy_dir, prices_path, tmp_path, capsys):
    cfg = _config(tmp_path, world, prices_path)
    code = main(["ask", Q, "--policy", str(policy_dir), "--config", str(cfg), "--kappa", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "answers" in out and "rounds 4/4" in out and "κ = 0.0000" in out
    assert "π base/guide/next" in out and "{base, guide, next}" in out


def test_ask_errors_are_one_line(world, policy_dir, prices_path, tmp_path, capsys):
    cfg = _config(tmp_path, world, prices_path, task=None)
    assert main(["ask", Q, "--policy", str(policy_dir), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "no task" in err and "Traceback" not in err
    assert main(["ask", Q, "--policy", str(tmp_path), "--config", str(cfg)]) == 2
    assert "not a trained policy folder" in capsys.readouterr().err


def test_serve_without_the_extra_names_it(tmp_path):
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
        "from ccpo.cli import main\n"
        f"sys.exit(main(['serve', '--policy', {str(tmp_path)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert r.returncode == 2
    assert "pip install 'ccpo[serve]'" in r.stderr and "Traceback" not in r.stderr


def test_serve_takes_the_key_flags_of_ask(policy_dir, prices_path, tmp_path):
    from tests.llm.conftest import make_world

    with make_world(api_key="the-upstream-key") as locked:
        cfg = _config(tmp_path, locked, prices_path)
        port = free_port()
        proc, url = _start_serve(
            policy_dir, cfg, port, "--base-key-env", "UP_KEY", "--guide-key-env", "UP_KEY",
            "--kappa", "0.25", env={**ENV, "UP_KEY": "the-upstream-key"},
        )  # fmt: skip
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=30)
            assert r.status_code == 200, r.text  # the locked endpoint got its key
            assert r.json()["kappa"] == 0.25
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
    assert "the-upstream-key" not in err
    help_text = subprocess.run(
        [sys.executable, "-m", "ccpo", "serve", "--help"],
        env=ENV, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    for flag in ("--base-key-env", "--guide-key-env", "--kappa", "/v1/chat/completions"):
        assert flag in help_text
