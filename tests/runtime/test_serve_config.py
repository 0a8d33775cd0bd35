"""What ``ccpo serve`` accepts in its config, flags and requests, through the real entry point:
numbers must be finite and in range (a config's ``max_cost_total: .inf`` or a request's
``"max_cost_usd": Infinity`` is refused, never taken as "no cap"), feedback without a rate
limit needs the bearer token, a malformed YAML file is one line naming where, and the port of
the config is the one served unless ``--port`` is given."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from ccpo.testing import free_port, wait_for_http
from tests.helpers.cli import ENV, assert_usage_error, ccpo, stop_server, write_deploy_config
from tests.helpers.serve import LiveServer, Q, make_service


@pytest.mark.parametrize(
    ("setting", "value"),
    [("max_cost_total", ".inf"), ("max_cost_per_request", ".nan"), ("timeout", "-.inf"),
     ("server.reservation_expiry", ".inf"), ("server.state_timeout", "Infinity")],
)  # fmt: skip
def test_a_config_number_that_is_not_finite_is_refused(
    setting, value, world, policy_dir, prices_path, tmp_path
):
    cfg = write_deploy_config(tmp_path, world, prices_path)
    section, _, key = setting.rpartition(".")
    line = f"{key}: {value}"
    cfg.write_text(cfg.read_text() + (f"{section}:\n  {line}\n" if section else f"{line}\n"))
    r = ccpo("serve", "--policy", str(policy_dir), "--config", str(cfg))
    assert_usage_error(r, "deploy.yaml", f"'{setting}'", "finite number")


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [("--max-cost-total", "inf", "finite number"), ("--max-cost-per-request", "nan", "finite"),
     ("--max-cost-per-request", "-1", "greater than 0"), ("--state-timeout", "inf", "finite")],
)  # fmt: skip
def test_a_flag_that_is_not_a_finite_number_in_range_is_refused(
    flag, value, needle, world, policy_dir, prices_path, tmp_path
):
    cfg = write_deploy_config(tmp_path, world, prices_path)
    r = ccpo("serve", "--policy", str(policy_dir), "--config", str(cfg), flag, value)
    assert_usage_error(r, f"{flag} {value}", needle)


def test_a_request_budget_that_is_not_a_finite_positive_number_gets_422(
    world, policy_dir, prices_path
):
    """JSON has no Infinity or NaN, but Python's parser reads them: a per-request budget of
    Infinity was taken as no cap at all. Nothing refused is asked upstream."""
    svc = make_service(policy_dir, world, prices_path)
    chat = {"model": "ccpo", "messages": [{"role": "user", "content": Q}]}
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        asked = world.n_requests
        for budget, needle in [("Infinity", "finite"), ("NaN", "finite"), ("-1", "greater")]:
            native = json.dumps({"question": Q})[:-1] + f', "max_cost_usd": {budget}}}'
            via_chat = json.dumps(chat)[:-1] + f', "ccpo": {{"max_cost_usd": {budget}}}}}'
            for path, body in [("/v1/answer", native), ("/v1/chat/completions", via_chat)]:
                r = http.post(path, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 422, (path, budget, r.text)
                message = r.json()["error"]["message"]
                assert "max_cost_usd" in message and needle in message, message
        assert world.n_requests == asked
        assert http.post("/v1/answer", json={"question": Q, "max_cost_usd": 1}).status_code == 200


def test_feedback_without_a_limit_needs_the_bearer_token(world, policy_dir, prices_path, tmp_path):
    """As docs/deploy.md says: ``feedback_per_minute: null`` (no limit) on a server without a
    token would let anyone who reaches it flood the feedback (and steer κ)."""
    cfg = write_deploy_config(tmp_path, world, prices_path, server={"feedback_per_minute": None})
    r = ccpo("serve", "--policy", str(policy_dir), "--config", str(cfg))
    assert_usage_error(r, "server.feedback_per_minute: null", "$CCPO_SERVE_TOKEN")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy_dir), "--config",
         str(cfg), "--port", str(port), "--log-level", "warning"],
        env={**ENV, "CCPO_SERVE_TOKEN": "s3cret"}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, 90, "ccpo serve")
    finally:
        log = stop_server(proc)
    assert "auth on" in log and "s3cret" not in log


def test_a_malformed_yaml_config_is_one_line_naming_where(policy_dir, tmp_path):
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text("server:\n  port: 8000\n state: s.sqlite\n")  # one space short
    err = assert_usage_error(
        ccpo("serve", "--policy", str(policy_dir), "--config", str(cfg)),
        f"{cfg}, line 3, column 2: not valid YAML", "indentation",
    )  # fmt: skip
    assert "^" not in err  # no excerpt of the file


def _serving_on(policy_dir, cfg, port: int, *flags: str) -> str:
    """``ccpo serve`` with ``flags`` answers on ``port``: its startup line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy_dir), "--config",
         str(cfg), *flags, "--log-level", "warning"],
        env=ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, 90, "ccpo serve")
    finally:
        log = stop_server(proc)
    return log


def test_the_config_port_is_served_unless_the_port_flag_is_given(
    world, policy_dir, prices_path, tmp_path
):
    """``--port`` has no default of its own: the config's ``server.port`` is served; a
    ``--port`` given on the command line wins over it."""
    mine, flag = free_port(), free_port()
    cfg = write_deploy_config(tmp_path, world, prices_path, server={"port": mine})
    assert f"http://127.0.0.1:{mine}" in _serving_on(policy_dir, cfg, mine)
    assert f"http://127.0.0.1:{flag}" in _serving_on(policy_dir, cfg, flag, "--port", str(flag))
