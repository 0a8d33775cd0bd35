"""The fast path ``joined_writes`` (``server.joined_writes``): a response's head leaves in one
write with the body that follows it in the same turn of the event loop.

uvicorn writes a response's head at ``http.response.start`` and its body at
``http.response.body``: two writes, and a client woken by each. :class:`JoinedWrites` wraps a
connection's transport (:func:`~ccpo.runtime.http.connections.guarded_protocol` puts it there)
and holds a head until the next write of the same turn; with the switch off the transport is
uvicorn's own.
"""

from __future__ import annotations

import asyncio
from typing import Any


class JoinedWrites:
    """A connection's transport that writes a response head with what follows it in the same
    turn of the event loop. A head that nothing follows within the turn (a stream's first
    event comes later) is written at the end of the turn; everything else goes through as it
    comes, in order. A head is a write that starts ``HTTP/1.`` and ends with the blank line;
    a body chunk that looks like one is merely held to the end of the turn."""

    __slots__ = ("_flush_handle", "_held", "_loop", "_t")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._t, self._loop = transport, loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._t, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data = self._held + bytes(data)
            self._drop()
        elif data[:7] == b"HTTP/1." and data[-4:] == b"\r\n\r\n":
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self._flush)
            return
        self._t.write(data)

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def _drop(self) -> None:
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def _flush(self) -> None:
        held = self._held
        self._drop()
        if held is not None and not self._t.is_closing():
            self._t.write(held)

    def write_eof(self) -> None:
        self._flush()
        self._t.write_eof()

    def close(self) -> None:
        self._flush()
        self._t.close()

    def abort(self) -> None:
        self._drop()
        self._t.abort()
