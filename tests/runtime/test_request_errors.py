"""Malformed or unsupported requests to the real ``ccpo replay-server`` and ``ccpo serve``
(subprocesses on 127.0.0.1) get a clear JSON 4xx, never a 500 in plain text nor a silently
ignored field."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import httpx
import pytest

from ccpo.testing import free_port, wait_for_http
from ccpo.traces.io import write_traces
from ccpo.traces.sim import SimConfig, generate
from tests.helpers.cli import ENV, start_serve, stop_server, write_deploy_config
from tests.helpers.serve import LiveServer, Q, assert_json_error, make_service


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

        assert_json_error(post({"model": "sim-base", "messages": 5}), 400, "messages")
        assert_json_error(post(msg([5])), 400, "messages[0].content[0]", "text part")
        assert_json_error(post(msg([{"type": "text", "text": None}])), 400, "content[0]")
        assert_json_error(post(b"[" * 30_000 + b"]" * 30_000), 400, "not JSON", "nested")
        assert_json_error(post(b'{"model": "sim-base", "x": NaN}'), 400, "not JSON")
        assert_json_error(post(b"x" * 70_000), 413, "larger than 65536 bytes")
        streamed = httpx.post(chat, content=iter([b"{" + b" " * 40_000] * 3), timeout=30)
        assert_json_error(streamed, 413, "larger than 65536")  # no Content-Length: cut while read
        ok = httpx.post(
            chat,
            json=msg(f"Question: {traces[0].question}\n"),
            headers={"X-CCPO-Round": "1", "X-CCPO-Role": "base"},
            timeout=30,
        )
        assert ok.status_code == 200, ok.text  # the server is alive and still answers
        assert ok.json()["ccpo_replay"]["trace_id"] == traces[0].id
        assert_raw_400(port, "garbage request line", MALFORMED["garbage request line"])
    finally:
        log = stop_server(proc)
    assert "Traceback" not in log, log


# ----------------------------------------------------------------------------- serve
def test_serve_refuses_what_it_cannot_honour(world, policy_dir, prices_path, tmp_path):
    proc, url = start_serve(
        policy_dir, write_deploy_config(tmp_path, world, prices_path), free_port()
    )
    try:
        chat = url + "/v1/chat/completions"

        def post(content: object = Q, **extra: object) -> httpx.Response:
            body = {"model": "ccpo", "messages": [{"role": "user", "content": content}], **extra}
            return httpx.post(chat, json=body, timeout=60)

        asked = world.n_requests
        assert_json_error(post([{"type": "text", "text": None}]), 422, "'text' must be a string")
        assert_json_error(post([{"type": "text", "text": 5}]), 422, "'text' must be a string")
        assert_json_error(
            post([{"type": "image_url", "image_url": {"url": "x"}}]), 422, "image_url"
        )
        assert_json_error(post(n=5), 422, "n: not supported")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        assert_json_error(post(tools=tools), 422, "tools: not supported")
        assert_json_error(post(response_format={"type": "json_object"}), 422, "response_format")
        assert_json_error(post(stream="yes"), 422, "stream")
        assert world.n_requests == asked  # nothing refused was asked (or charged) upstream
        ok = post([{"type": "text", "text": Q}], n=1, temperature=0.7, tools=[])
        assert ok.status_code == 200, ok.text
        assert ok.json()["ccpo"]["cost_usd"] > 0 and world.n_requests > asked
    finally:
        log = stop_server(proc)
    assert "Traceback" not in log, log


# ----------------------------------------------------------------------------- transport
_BODY = json.dumps({"question": Q}).encode()
MALFORMED = {
    "garbage request line": b"HELLO THERE\r\n\r\n",
    "bad Content-Length": b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "negative Content-Length": b"POST /v1/answer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    # a whole question in the chunked body: refused, never answered (nor paid for)
    "Content-Length and Transfer-Encoding": b"POST /v1/answer HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    + f"{len(_BODY):x}\r\n".encode()
    + _BODY
    + b"\r\n0\r\n\r\n",
}


def assert_raw_400(port: int, what: str, raw: bytes) -> None:
    """``raw`` sent to 127.0.0.1:``port`` gets the JSON 400 (``bad_request``) and the
    connection closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        got = b""
        while chunk := s.recv(65536):  # until the server closes the connection
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0] == "HTTP/1.1 400 Bad Request", (what, got)
    assert headers["content-type"] == "application/json", (what, got)
    assert headers["connection"] == "close" and int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["type"] == "bad_request" and "malformed HTTP request" in error["message"]


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_request_the_http_parser_refuses_gets_the_json_400(
    parser, world, policy_dir, prices_path, monkeypatch
):
    """What uvicorn's parser refuses (before any route runs) is answered with the server's one
    JSON error body and the connection closed, under either parser uvicorn may run; the next
    client is served."""
    import uvicorn.protocols.http.auto as auto

    if parser == "h11":  # what http="auto" picks where httptools is not installed
        from uvicorn.protocols.http.h11_impl import H11Protocol

        monkeypatch.setattr(auto, "AutoHTTPProtocol", H11Protocol)
    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        asked = world.n_requests
        for what, raw in MALFORMED.items():
            assert_raw_400(ls.port, what, raw)
        assert world.n_requests == asked
        r = httpx.post(ls.url + "/v1/answer", json={"question": Q}, timeout=60)
        assert r.status_code == 200, r.text
