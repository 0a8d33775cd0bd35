"""Issue 32's papercuts over HTTP, against the real ``ccpo replay-server`` and ``ccpo serve``
(subprocesses on 127.0.0.1): malformed or unsupported requests get a clear JSON 4xx, never a
500 in plain text nor a silently ignored field; upstream errors reach neither clients nor logs
with what they echo of a key; a password in an endpoint URL is never shown.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from ccpo.testing import free_port, wait_for_http
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import write_traces
from ccpo.traces.sim import SimConfig, generate
from tests.helpers.cli import ENV, start_serve
from tests.helpers.serve import Q, deploy_values
from tests.helpers.world import make_world


def _stop(proc: subprocess.Popen) -> str:
    """Stop a server process; its stderr (the log)."""
    proc.terminate()
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=20)[1]


def _is_json_error(r: httpx.Response, status: int, *needles: str) -> str:
    """``r`` is ``status`` with ccpo's JSON error body, every needle in its message."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    msg = r.json()["error"]["message"]
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ----------------------------------------------------------------------------- replay-server
def test_replay_server_refuses_malformed_requests_in_json(tmp_path):
    traces = generate(SimConfig(n=20, seed=2))
    path = tmp_path / "sim.jsonl"
    write_traces(path, traces)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "replay-server", "--traces", str(path),
         "--port", str(port), "--max-body-bytes", "65536"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/healthz", proc, 90, "ccpo replay-server")
        chat = url + "/v1/chat/completions"

        def post(body: object | bytes) -> httpx.Response:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            return httpx.post(chat, content=data, timeout=30)

        def msg(content: object) -> dict:
            return {"model": "sim-base", "messages": [{"role": "user", "content": content}]}

        _is_json_error(post({"model": "sim-base", "messages": 5}), 400, "messages")
        _is_json_error(post(msg([5])), 400, "messages[0].content[0]", "text part")
        _is_json_error(post(msg([{"type": "text", "text": None}])), 400, "content[0]")
        _is_json_error(post(b"[" * 30_000 + b"]" * 30_000), 400, "not JSON", "nested")
        _is_json_error(post(b'{"model": "sim-base", "x": NaN}'), 400, "not JSON")
        _is_json_error(post(b"x" * 70_000), 413, "larger than 65536 bytes")
        streamed = httpx.post(chat, content=iter([b"{" + b" " * 40_000] * 3), timeout=30)
        _is_json_error(streamed, 413, "larger than 65536")  # no Content-Length: cut while read
        ok = httpx.post(
            chat,
            json=msg(f"Question: {traces[0].question}\n"),
            headers={"X-CCPO-Round": "1", "X-CCPO-Role": "base"},
            timeout=30,
        )
        assert ok.status_code == 200, ok.text  # the server is alive and still answers
        assert ok.json()["ccpo_replay"]["trace_id"] == traces[0].id
    finally:
        log = _stop(proc)
    assert "Traceback" not in log, log


# ----------------------------------------------------------------------------- serve
def _config(tmp_path: Path, world, prices: Path, **kw) -> Path:
    p = tmp_path / "deploy.yaml"
    p.write_text(yaml.safe_dump(deploy_values(world, prices, **kw)))
    return p


def test_serve_refuses_what_it_cannot_honour(world, policy_dir, prices_path, tmp_path):
    proc, url = start_serve(policy_dir, _config(tmp_path, world, prices_path), free_port())
    try:
        chat = url + "/v1/chat/completions"

        def post(content: object = Q, **extra: object) -> httpx.Response:
            body = {"model": "ccpo", "messages": [{"role": "user", "content": content}], **extra}
            return httpx.post(chat, json=body, timeout=60)

        asked = world.n_requests
        _is_json_error(post([{"type": "text", "text": None}]), 422, "'text' must be a string")
        _is_json_error(post([{"type": "text", "text": 5}]), 422, "'text' must be a string")
        _is_json_error(post([{"type": "image_url", "image_url": {"url": "x"}}]), 422, "image_url")
        _is_json_error(post(n=5), 422, "n: not supported")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        _is_json_error(post(tools=tools), 422, "tools: not supported")
        _is_json_error(post(response_format={"type": "json_object"}), 422, "response_format")
        _is_json_error(post(stream="yes"), 422, "stream")
        assert world.n_requests == asked  # nothing refused was asked (or charged) upstream
        ok = post([{"type": "text", "text": Q}], n=1, temperature=0.7, tools=[])
        assert ok.status_code == 200, ok.text
        assert ok.json()["ccpo"]["cost_usd"] > 0 and world.n_requests > asked
    finally:
        log = _stop(proc)
    assert "Traceback" not in log, log


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
        cfg = _config(tmp_path, up, prices_path, base_api_key="sk-secret-1234-3456")
        proc, url = start_serve(policy_dir, cfg, free_port())
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = _stop(proc)
    msg = _is_json_error(r, 502, f"HTTP {status}", "invalid_api_key")
    for leaked in ("sk-sec", "3456", "Incorrect API key", "find your key"):
        assert leaked not in msg and leaked not in log, (leaked, msg, log)
    assert "request" in log  # the failure is logged, without the upstream text


def test_a_rejected_config_key_is_named_as_the_config_key(policy_dir, prices_path, tmp_path):
    with ScriptedServer(fallback="Answer: A", api_key="the-right-key") as up:
        cfg = _config(tmp_path, up, prices_path, base_api_key="sk-wrong-key-in-config")
        proc, url = start_serve(policy_dir, cfg, free_port())
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = _stop(proc)
    msg = _is_json_error(r, 502, "authentication failed", "api_key given for 'base-m'")
    assert "OPENAI_API_KEY" not in msg
    assert "sk-wrong-key-in-config" not in msg + log


def test_a_password_in_an_endpoint_url_is_never_shown(policy_dir, prices_path, tmp_path):
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as dead:
        secret_url = dead.url.replace("http://", "http://ops:hunter2@")
        cfg = _config(tmp_path, dead, prices_path, base_url=secret_url, guide_url=secret_url,
                      max_retries=1)  # fmt: skip
        proc, url = start_serve(policy_dir, cfg, free_port(), env={**ENV, "COLUMNS": "200"})
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60)
        finally:
            log = _stop(proc)
    assert r.status_code == 502, r.text
    assert "hunter2" not in r.text and "hunter2" not in log, (r.text, log)
    assert "ops:***@" in log  # the log still says which endpoint failed


@pytest.mark.parametrize(
    ("flags", "accepted"),
    [((), 10), (("--feedback-per-minute", "6000", "--feedback-burst", "1000"), 14)],
    ids=["default", "batch-setting"],
)
def test_feedback_limits_as_documented(flags, accepted, world, policy_dir, prices_path, tmp_path):
    """docs/deploy.md: one address may send 10 feedbacks at once by default (the 11th is a
    429 with Retry-After); the documented batch setting takes them all."""
    cfg = _config(tmp_path, world, prices_path)
    proc, url = start_serve(policy_dir, cfg, free_port(), *flags)
    try:
        for i in range(14):
            r = httpx.post(url + "/v1/answer", json={"question": Q, "id": f"q-{i}"}, timeout=60)
            assert r.status_code == 200, r.text
        codes = [
            httpx.post(
                url + "/v1/feedback", json={"id": f"q-{i}", "none_of_them": True}
            ).status_code
            for i in range(14)
        ]
        retry = httpx.post(url + "/v1/feedback", json={"id": "q-0", "none_of_them": True})
    finally:
        _stop(proc)
    assert codes == [200] * accepted + [429] * (14 - accepted), codes
    if accepted < 14:
        assert retry.status_code == 429 and int(retry.headers["Retry-After"]) >= 1


def test_the_postgresql_quick_start_of_deploy_md_works(world, policy_dir, prices_path, tmp_path):
    """docs/deploy.md's local PostgreSQL quick start, run as written (as an ordinary user: the
    ``postgres`` user when the tests run as root; on a free port instead of 5432, in a
    throw-away home), then ``ccpo serve`` on the state URL it gives answers and stores."""
    import os
    import shutil
    import tempfile

    from ccpo.testing.postgres import find_pg_bin

    pg_bin = find_pg_bin()
    if pg_bin is None or shutil.which("psql") is None:
        pytest.skip("no PostgreSQL on this machine")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    block = doc.split("**A local PostgreSQL in five minutes**")[1].split("```bash\n")[1]
    port = str(free_port())
    script = block.split("```")[0].replace("5432", port)
    home = Path(tempfile.mkdtemp(prefix="ccpo-quick-start-"))  # outside pytest's 0700 tree
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root, as the doc says
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    env = {"PATH": f"{pg_bin}:/usr/bin:/bin", "HOME": str(home)}
    setup = subprocess.run([*as_user, "env", *(f"{k}={v}" for k, v in env.items()),
                            "bash", "-e", "-c", script],
                           capture_output=True, text=True, timeout=180)  # fmt: skip
    try:
        assert setup.returncode == 0, setup.stdout + setup.stderr
        state = f"postgresql://ccpo@127.0.0.1:{port}/ccpo"
        pgpass = tmp_path / "pgpass"  # the line the doc appended, readable by this user
        shutil.copy(home / ".pgpass", pgpass)
        pgpass.chmod(0o600)
        proc, url = start_serve(
            policy_dir, _config(tmp_path, world, prices_path), free_port(), "--state", state,
            env={**ENV, "PGPASSFILE": str(pgpass)},
        )  # fmt: skip
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q, "id": "qs-1"}, timeout=60)
            assert r.status_code == 200, r.text
        finally:
            log = _stop(proc)
        assert "Traceback" not in log, log
        import psycopg

        with psycopg.connect(state, passfile=str(pgpass)) as conn:
            assert conn.execute("SELECT count(*) FROM ccpo_answers").fetchone() == (1,)
    finally:
        subprocess.run([*as_user, str(pg_bin / "pg_ctl"), "-D", str(home / "ccpo-pg"),
                        "-m", "immediate", "stop"], capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_ask_takes_endpoints_on_the_command_line(form, world, policy_dir, prices_path, tmp_path):
    """``--endpoints`` (listed in ask/serve --help) is a YAML or JSON mapping, used as the
    config's ``endpoints:``: both models at the scripted world, no URL in the config."""
    cfg = _config(tmp_path, world, prices_path, base_url=None, guide_url=None)
    value = (
        f"{{base-m: {{url: {world.url}}}, guide-m: {{url: {world.url}}}}}"
        if form == "yaml"
        else json.dumps({m: {"url": world.url} for m in ("base-m", "guide-m")})
    )
    asked = world.n_requests
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "ask", Q, "--policy", str(policy_dir),
         "--config", str(cfg), "--endpoints", value, "--json"],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["answers"] and world.n_requests > asked
