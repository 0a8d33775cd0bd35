"""``ccpo ask`` and ``ccpo serve`` as commands: serve a subprocess over real HTTP, ask through the
console script's function in this process (``tests.helpers.cli.ccpo_ok``) unless the process
matters (an install without the serve extra)."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from ccpo.cli import main
from ccpo.testing import free_port
from tests.helpers.cli import ENV, ccpo_ok, start_serve, write_deploy_config
from tests.helpers.serve import Q, state_at


def test_ask_json_matches_serve(world, any_policy_dir, prices_path, tmp_path):
    cfg = write_deploy_config(tmp_path, world, prices_path)
    port = free_port()
    state = state_at(tmp_path, "state.sqlite")
    proc, url = start_serve(any_policy_dir, cfg, port, "--state", state)
    try:
        api = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=30).json()
        out = ccpo_ok("ask", Q, "--policy", str(any_policy_dir), "--config", str(cfg), "--json")
        cli = json.loads(out.stdout)
        for d in (api, cli):
            d.pop("id")
            d.pop("latency_ms")
            d.pop("ttft_ms")  # timings: the only fields that differ between two runs
        assert cli == api
        assert httpx.get(url + "/metrics.json").json()["requests"] == 1  # in the state
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert f"ccpo serve: {any_policy_dir.name} (T = 4" in err  # the variant served


def test_ask_human_output(world, policy_dir, prices_path, tmp_path, capsys):
    cfg = write_deploy_config(tmp_path, world, prices_path)
    code = main(["ask", Q, "--policy", str(policy_dir), "--config", str(cfg), "--kappa", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "answers" in out and "rounds 4/4" in out and "κ = 0.0000" in out
    assert "π base/guide/next" in out and "{base, guide, next}" in out


def test_ask_errors_are_one_line(world, policy_dir, prices_path, tmp_path, capsys):
    cfg = write_deploy_config(tmp_path, world, prices_path, task=None)
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
    from tests.helpers.world import make_world

    with make_world(api_key="the-upstream-key") as locked:
        cfg = write_deploy_config(tmp_path, locked, prices_path)
        port = free_port()
        proc, url = start_serve(
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


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_ask_takes_endpoints_on_the_command_line(form, world, policy_dir, prices_path, tmp_path):
    """``--endpoints`` (listed in ask/serve --help) is a YAML or JSON mapping, used as the
    config's ``endpoints:``: both models at the scripted world, no URL in the config."""
    cfg = write_deploy_config(tmp_path, world, prices_path, base_url=None, guide_url=None)
    value = (
        f"{{base-m: {{url: {world.url}}}, guide-m: {{url: {world.url}}}}}"
        if form == "yaml"
        else json.dumps({m: {"url": world.url} for m in ("base-m", "guide-m")})
    )
    asked = world.n_requests
    r = ccpo_ok("ask", Q, "--policy", str(policy_dir), "--config", str(cfg),
                "--endpoints", value, "--json")  # fmt: skip
    assert json.loads(r.stdout)["answers"] and world.n_requests > asked
