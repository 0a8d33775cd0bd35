"""An upstream error through the real ``ccpo serve`` (a subprocess on 127.0.0.1) becomes
ccpo's own JSON 502 with a short reason and the request's id (the log has the detail under
that id): neither the reply nor the log shows what the upstream echoed of a key, the wrong key
of the config, or a password in an endpoint URL."""

from __future__ import annotations

import httpx
import pytest

from ccpo.testing import free_port
from ccpo.testing.scripted_server import ScriptedServer
from tests.helpers.cli import ENV, start_serve, stop_server, write_deploy_config
from tests.helpers.serve import Q, assert_json_error
from tests.helpers.world import make_world

LEAKY = {
    "error": {
        "message": "Incorrect API key provided: sk-sec********3456. You can find your key at ...",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.mark.parametrize("status", [400, 404, 422])
def test_upstream_error_text_reaches_neither_client_nor_log(
    status, policy_dir, prices_path, tmp_path
):
    """An upstream 4xx that echoes the key (partly masked, as providers do) becomes ccpo's own
    502 body: the status and the error's identifiers, never its text, in the reply and in
    serve's log alike."""
    with ScriptedServer(failure_rate=1.0, failure_kinds=(str(status),), failure_body=LEAKY) as up:
        cfg = write_deploy_config(tmp_path, up, prices_path, base_api_key="sk-secret-1234-3456")
        proc, url = start_serve(policy_dir, cfg, free_port())
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = stop_server(proc)
    msg = assert_json_error(r, 502, "an LLM endpoint", "the server log has why")
    assert f"HTTP {status}" not in msg and "base-m" not in msg  # the detail is the log's
    for leaked in ("sk-sec", "3456", "Incorrect API key", "find your key"):
        assert leaked not in msg and leaked not in log, (leaked, msg, log)
    rid = msg.split("(request ")[1].split(";")[0]
    said = [ln for ln in log.splitlines() if f"request {rid}:" in ln]  # logged, under its id,
    assert said and f"HTTP {status}" in said[0] and "invalid_api_key" in said[0]  # no text


def test_a_rejected_config_key_is_named_as_the_config_key(policy_dir, prices_path, tmp_path):
    with ScriptedServer(fallback="Answer: A", api_key="the-right-key") as up:
        cfg = write_deploy_config(tmp_path, up, prices_path, base_api_key="sk-wrong-key-in-config")
        proc, url = start_serve(policy_dir, cfg, free_port())
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = stop_server(proc)
    msg = assert_json_error(r, 502, "refused the request (its key or model)")
    assert "authentication failed" in log and "api_key given for 'base-m'" in log
    assert "OPENAI_API_KEY" not in msg + log
    assert "sk-wrong-key-in-config" not in msg + log


def test_a_password_in_an_endpoint_url_is_never_shown(policy_dir, prices_path, tmp_path):
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as dead:
        secret_url = dead.url.replace("http://", "http://ops:hunter2@")
        cfg = write_deploy_config(tmp_path, dead, prices_path, base_url=secret_url,
                                  guide_url=secret_url, max_retries=1)  # fmt: skip
        proc, url = start_serve(policy_dir, cfg, free_port(), env={**ENV, "COLUMNS": "200"})
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = stop_server(proc)
    assert r.status_code == 502, r.text
    assert "hunter2" not in r.text and "hunter2" not in log, (r.text, log)
    assert "ops:***@" in log  # the log still says which endpoint failed
