"""A response's head leaves with its body in one write (``connections.JoinedWrites``), over
real sockets on 127.0.0.1: an asyncio server whose transport is wrapped, and ``ccpo serve``'s
own uvicorn settings answering real requests. The transport's writes are recorded by a thin
pass-through (what reached the socket, in order), never replaced."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ccpo.runtime.http import connections
from ccpo.runtime.http.joined_writes import JoinedWrites
from tests.helpers.serve import LiveServer, make_service

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class Recorder:
    """A transport's pass-through that keeps every write that reached it."""

    def __init__(self, transport) -> None:
        self.t, self.writes = transport, []

    def __getattr__(self, name):
        return getattr(self.t, name)

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self.t.write(data)


async def _pair(script):
    """Serve one connection on 127.0.0.1 whose wrapped transport ``script(joined, loop)``
    writes to; what the client read to EOF, and the writes that reached the socket."""
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    class Proto(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            rec = Recorder(transport)
            loop = asyncio.get_running_loop()
            loop.create_task(script(JoinedWrites(rec, loop), loop)).add_done_callback(
                lambda t: done.set_result(rec.writes) if t.exception() is None else
                done.set_exception(t.exception())
            )  # fmt: skip

    server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = await asyncio.wait_for(reader.read(), 5)
    writes = await done
    writer.close()
    server.close()
    return got, writes


def test_a_head_and_its_body_in_one_turn_leave_in_one_write() -> None:
    async def script(t, loop):
        t.write(HEAD)
        t.write(b"hello")
        t.close()

    got, writes = asyncio.run(_pair(script))
    assert got == HEAD + b"hello" and writes == [HEAD + b"hello"]


def test_a_head_alone_in_its_turn_leaves_at_the_end_of_the_turn() -> None:
    """A stream: the head is written once the turn ends, before the first event; each event
    goes through as it comes; nothing is lost or reordered."""
    seen: list[list[bytes]] = []

    async def script(t, loop):
        rec = t._t
        t.write(HEAD)
        assert rec.writes == []  # held within the turn
        await asyncio.sleep(0.05)
        seen.append(list(rec.writes))  # the head went out at the end of its turn
        t.write(b"he")
        t.write(b"llo")
        t.close()

    got, writes = asyncio.run(_pair(script))
    assert seen == [[HEAD]] and writes == [HEAD, b"he", b"llo"] and got == HEAD + b"hello"


def test_close_and_abort_with_a_head_held() -> None:
    async def closes(t, loop):
        t.write(HEAD)
        t.close()  # the held head is written before the close

    got, writes = asyncio.run(_pair(closes))
    assert got == HEAD and writes == [HEAD]

    async def aborts(t, loop):
        t.write(b"first ")
        t.write(HEAD)
        t.abort()  # an abort drops what is buffered: the held head too

    got, writes = asyncio.run(_pair(aborts))
    assert writes == [b"first "] and got in (b"", b"first ")


def test_what_is_not_a_head_goes_through_at_once() -> None:
    raw = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 2\r\n\r\n{}"  # a whole response

    async def script(t, loop):
        rec = t._t
        t.write(raw)
        t.writelines([b"a", b"b"])
        assert rec.writes == [raw, b"ab"]
        t.close()

    got, writes = asyncio.run(_pair(script))
    assert got == raw + b"ab" and writes == [raw, b"ab"]


@pytest.fixture()
def recorded(monkeypatch):
    """Every connection ``serve`` accepts from now on has its writes recorded."""
    made: list[Recorder] = []

    class Recorded(JoinedWrites):
        def __init__(self, transport, loop) -> None:
            made.append(Recorder(transport))
            super().__init__(made[-1], loop)

    monkeypatch.setattr(connections, "JoinedWrites", Recorded)
    return made


def test_serve_answers_in_one_write_per_response(recorded, world, policy_dir, prices_path):
    """``/v1/answer`` and ``/healthz`` (the fast paths), a 404 and a validation error (the
    app's): each response is one write holding its head and its whole body."""
    service = make_service(policy_dir, world, prices_path)
    with LiveServer(service) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        a = http.post("/v1/answer", json={"question": "Which?\nA. 1\nB. 2"})
        h = http.get("/healthz")
        n = http.get("/no-such-path")
        bad = http.post("/v1/answer", json={"question": 7})
    assert [r.status_code for r in (a, h, n, bad)] == [200, 200, 404, 422]
    (rec,) = recorded  # one kept-alive connection
    assert len(rec.writes) == 4
    for w, r in zip(rec.writes, (a, h, n, bad), strict=True):
        head, _, body = w.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % r.status_code)
        assert json.loads(body) == r.json()
