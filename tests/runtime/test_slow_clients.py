"""Issue 25, item 2: slow and idle clients cannot hold ``ccpo serve``, over real HTTP on
127.0.0.1 (uvicorn with the server's own settings in a thread, the scripted LLM world behind
it; one test through the real entry point under a low ``ulimit -n``). Raw sockets play the
slow clients: they send part of a request, then a byte now and then, and time how long the
server keeps them."""

from __future__ import annotations

import contextlib
import json
import resource
import select
import socket
import struct
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from ccpo.testing import free_port, wait_for_http
from tests.helpers.cli import ENV
from tests.helpers.serve import LiveServer, deploy_values, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
FAST = {"header_timeout": 0.5, "body_timeout": 0.5, "keep_alive_timeout": 1.0}
SLACK = 1.0  # seconds a close may come after its deadline on a busy 2-core machine
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # incomplete: no blank line


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def hold(
    sock: socket.socket, first: bytes, drip: bytes = b"", every: float = 0.1, limit: float = 5.0
) -> tuple[bytes, float]:
    """Send ``first``, then ``drip`` every ``every`` s, until the server closes the connection:
    what it sent, and the seconds from ``first`` to the close. Fails if still open after
    ``limit`` s."""
    t0 = time.monotonic()
    sock.sendall(first)
    got = b""
    while time.monotonic() - t0 < limit:
        if select.select([sock], [], [], every)[0]:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return got, time.monotonic() - t0
            got += data
        elif drip:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(drip)  # if closed, the next recv says so
    raise AssertionError(f"connection still open after {limit} s (got {got!r})")


def closed_all(socks: list[socket.socket], limit: float) -> list[tuple[bytes, float]]:
    """Wait for the server to close every one of ``socks`` (idle meanwhile): what each got and
    when it was closed (seconds from now). Fails if any is still open after ``limit`` s."""
    t0 = time.monotonic()
    got = {s: b"" for s in socks}
    when: dict[socket.socket, float] = {}
    while len(when) < len(socks) and time.monotonic() - t0 < limit:
        for s in select.select([s for s in socks if s not in when], [], [], 0.5)[0]:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                got[s] += data
            else:
                when[s] = time.monotonic() - t0
    assert len(when) == len(socks), f"{len(socks) - len(when)} still open after {limit} s"
    return [(got[s], when[s]) for s in socks]


_unread: dict[int, bytes] = {}  # bytes read past a response, by socket (pipelined replies)


def response(sock: socket.socket) -> bytes:
    """One whole response (by its content-length) read from ``sock``; bytes that belong to
    the next response (pipelined requests can be answered in one segment) are kept for it."""
    got = _unread.pop(sock.fileno(), b"")

    def whole() -> int:  # length of the first whole response in ``got``, 0 if incomplete
        head, sep, body = got.partition(b"\r\n\r\n")
        if not sep:
            return 0
        size = int(head.lower().partition(b"content-length: ")[2].split(b"\r\n")[0] or 0)
        return len(head) + len(sep) + size if len(body) >= size else 0

    while not whole():
        assert select.select([sock], [], [], 5)[0], got
        data = sock.recv(65536)
        assert data, got
        got += data
    end = whole()
    if got[end:]:
        _unread[sock.fileno()] = got[end:]
    return got[:end]


def parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    """One HTTP/1.1 response: status, headers, JSON body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_a_trickled_head_gets_408_and_is_closed_within_header_timeout(
    world, policy_dir, prices_path
):
    with LiveServer(make_service(policy_dir, world, prices_path, FAST)) as ls:
        with connect(ls.port) as s:  # a byte every 0.1 s: never a whole head
            got, held = hold(s, HEAD, b"X")
        status, headers, body = parse(got)
        assert status == 408 and headers["connection"] == "close"
        assert body == {
            "error": {"type": "timeout", "message": "request head not received within 0.5 s"}
        }
        assert 0.45 <= held <= 0.5 + SLACK
        with connect(ls.port) as s:  # a connection that never sends a byte
            got, held = hold(s, b"")
        assert parse(got)[0] == 408 and 0.45 <= held <= 0.5 + SLACK
        assert httpx.get(ls.url + "/healthz", timeout=5).status_code == 200


def test_idle_keep_alive_closes_quietly_and_the_next_head_has_its_own_deadline(
    world, policy_dir, prices_path
):
    """After a response, an idle kept-alive connection is closed after keep_alive_timeout (1 s,
    longer than header_timeout: no 408 to a client that sent nothing); a next request that
    trickles in gets header_timeout from its first byte."""
    request = HEAD + b"\r\n"
    with LiveServer(make_service(policy_dir, world, prices_path, FAST)) as ls:
        with connect(ls.port) as s:
            s.sendall(request)
            first = response(s)
            got, idle = hold(s, b"")
        assert first.startswith(b"HTTP/1.1 200") and got == b""
        assert 0.95 <= idle <= 1.0 + SLACK
        with connect(ls.port) as s:
            s.sendall(request)
            assert response(s).startswith(b"HTTP/1.1 200")
            time.sleep(0.7)  # idle past header_timeout, within keep-alive
            got, held = hold(s, HEAD, b"X")
        assert parse(got)[0] == 408 and 0.45 <= held <= 0.5 + SLACK


def test_a_trickled_body_gets_408_with_the_json_error_and_is_counted(
    world, policy_dir, prices_path
):
    head = (
        b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 200\r\n\r\n"
    )
    with LiveServer(make_service(policy_dir, world, prices_path, FAST)) as ls:
        before = httpx.get(ls.url + "/metrics.json").json()["rejected"]
        with connect(ls.port) as s:
            got, held = hold(s, head + b'{"question": ', b" ")
        status, headers, body = parse(got)
        assert status == 408 and headers["connection"] == "close"
        assert body == {
            "error": {"type": "timeout", "message": "request body not received within 0.5 s"}
        }
        assert 0.45 <= held <= 0.5 + SLACK
        assert httpx.get(ls.url + "/metrics.json").json()["rejected"] == before + 1
        # a body in two parts, 0.2 s apart: within body_timeout, answered
        payload = json.dumps({"question": Q}).encode()
        with connect(ls.port) as s:
            s.sendall(head.replace(b"200", str(len(payload)).encode()) + payload[:10])
            time.sleep(0.2)
            s.sendall(payload[10:])
            got, _ = hold(s, b"", limit=30)  # connection: close after the answer
        status, _, body = parse(got.replace(b"connection: close\r\n", b""))
        assert status == 200 and body["answers"], got[:300]


def test_over_max_connections_gets_503_and_places_are_never_leaked(world, policy_dir, prices_path):
    """max_connections 20: with 20 partial requests held, one more gets a 503 at once; once the
    slow ones are closed (408), /healthz answers within a second. Every way a connection ends
    (our 408, our 503, the client's close, the client's reset) gives its place back: exactly 20
    fit again afterwards."""
    conf = {**FAST, "header_timeout": 1.0, "max_connections": 20}
    with LiveServer(make_service(policy_dir, world, prices_path, conf)) as ls:
        slow = [connect(ls.port) for _ in range(20)]
        for s in slow:
            s.sendall(HEAD)
        time.sleep(0.3)  # accepted
        with connect(ls.port) as s:
            got, held = hold(s, HEAD + b"\r\n")
        status, headers, body = parse(got)
        assert status == 503 and headers["connection"] == "close" and held < 0.5
        assert body["error"]["type"] == "busy" and "(20)" in body["error"]["message"]
        ends = [hold(s, b"", limit=1.0 + SLACK + 1) for s in slow]  # the 408s
        assert all(parse(got)[0] == 408 for got, _ in ends)
        t0 = time.monotonic()
        assert httpx.get(ls.url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 1.0
        for s in slow:
            s.close()

        # the client's close (FIN) and the client's reset (RST)
        gone = [connect(ls.port) for _ in range(20)]
        for i, s in enumerate(gone):
            s.sendall(HEAD)
            if i % 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
        time.sleep(0.3)
        for s in gone:
            s.close()
        time.sleep(0.3)
        again = [connect(ls.port) for _ in range(20)]
        for s in again:
            s.sendall(HEAD)
        time.sleep(0.3)
        assert not select.select(again, [], [], 0)[0]  # all 20 held, none refused
        with connect(ls.port) as s:
            got, _ = hold(s, HEAD + b"\r\n")
        assert parse(got)[0] == 503
        for s in again:
            s.close()


def test_ccpo_serve_under_a_low_ulimit_survives_more_slow_clients_than_files(
    world, policy_dir, prices_path, tmp_path
):
    """The real entry point under ``ulimit -n 256`` with 300 partial requests held at once
    (more than it may open files): the cap is fitted to the limit (160, with a warning), the
    slow connections are all closed within the timeouts (408, or 503 over the cap), /healthz
    then answers within a second, and the server neither died nor ran out of files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 600:  # this side holds the 300 connections
        if hard != resource.RLIM_INFINITY and hard < 600:
            pytest.skip(f"needs 600 open files (ulimit -Hn is {hard})")
        resource.setrlimit(resource.RLIMIT_NOFILE, (600, hard))
    values = deploy_values(world, prices_path)
    values["server"] = {"header_timeout": 2.0, "body_timeout": 2.0}
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(yaml.safe_dump(values))
    port = free_port()
    log = tmp_path / "serve.log"

    def low_ulimit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy_dir),
             "--config", str(cfg), "--port", str(port), "--state", str(tmp_path / "s.db"),
             "--log-level", "warning"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=low_ulimit,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    slow: list[socket.socket] = []
    try:
        wait_for_http(url + "/healthz", proc, 90, "ccpo serve")
        body = b"POST /v1/answer HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{"
        for i in range(300):  # within half a second, 8 at a time: the server's queue is short
            s = connect(port)  # (16 under this limit; a burst beyond it waits in the kernel,
            s.sendall(body if i % 2 else HEAD)  # on TCP's retries, not on the server)
            slow.append(s)
            if i % 8 == 7:
                time.sleep(0.01)
        ends = closed_all(slow, 2.0 + SLACK + 1)  # + 1 s: the time it took to open them
        statuses = sorted({got[9:12] for got, _ in ends})
        assert statuses == [b"408", b"503"], statuses
        t0 = time.monotonic()
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 1.0
        assert proc.poll() is None
    finally:
        for s in slow:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "Too many open files" not in text
    assert "max_connections lowered from 1000 to 160" in text


def test_normal_requests_keep_alive_and_pipelining_still_work(world, policy_dir, prices_path):
    with LiveServer(make_service(policy_dir, world, prices_path, FAST)) as ls:
        with connect(ls.port) as s:  # three requests on one connection, 0.3 s apart
            for _ in range(3):
                s.sendall(HEAD + b"\r\n")
                assert parse(response(s))[2]["status"] == "ok"
                time.sleep(0.3)
        with connect(ls.port) as s:  # two pipelined requests in one write
            s.sendall((HEAD + b"\r\n") * 2)
            assert [parse(response(s))[0] for _ in range(2)] == [200, 200]
        with httpx.Client(base_url=ls.url, timeout=30) as http:
            r = http.post("/v1/answer", json={"question": Q})
            assert r.status_code == 200 and r.json()["answers"]
            assert http.get("/healthz").status_code == 200  # the same kept-alive connection


def test_a_head_over_the_limit_gets_431_whichever_parser_uvicorn_runs(
    world, policy_dir, prices_path
):
    """httptools (taken when installed) bounds no request head by itself: a head still
    incomplete after MAX_HEAD_BYTES gets the JSON 431 and the connection is closed, at once
    (not at the header deadline); a large head that is complete is served."""
    from ccpo.runtime.connections import MAX_HEAD_BYTES

    with LiveServer(make_service(policy_dir, world, prices_path, FAST)) as ls:
        with connect(ls.port) as s:  # one header that never ends, in 4 kB pieces
            got, held = hold(s, HEAD + b"X-Big: ", b"a" * 4096, every=0.01)
        status, headers, body = parse(got)
        assert status == 431 and headers["connection"] == "close", got
        assert body == {
            "error": {
                "type": "head_too_large",
                "message": f"request head over {MAX_HEAD_BYTES} bytes",
            }
        }
        assert held < 0.45  # refused for its size, before the 0.5 s head deadline
        with connect(ls.port) as s:  # a complete head of 12 kB: answered
            s.sendall(HEAD + b"X-Big: " + b"a" * 12_000 + b"\r\n\r\n")
            assert parse(response(s))[0] == 200
        assert httpx.get(ls.url + "/healthz", timeout=5).status_code == 200
