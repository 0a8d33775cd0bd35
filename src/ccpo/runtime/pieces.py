"""Where a streamed reply's pieces go on their way to the client: :class:`Held` keeps a
hedged reply's pieces until its round takes them, :class:`Timed` notes when the first piece
with content passed (the time to first token). Used by
:class:`ccpo.runtime.agent.ConformalAgent`.
"""

from __future__ import annotations

import time
from typing import Any


class Held:
    """The pieces of a reply sent ahead (hedged), kept until its round takes it (:meth:`take`),
    then passed on to ``to`` as they come (None: not streamed)."""

    def __init__(self, to: Any) -> None:
        self.to, self.pieces, self.taken = to, [], False

    def put(self, piece: str) -> None:
        if self.taken and self.to is not None:
            self.to(piece)
        else:
            self.pieces.append(piece)

    def take(self) -> None:
        self.taken = True
        if self.to is not None:
            for p in self.pieces:
                self.to(p)
        self.pieces.clear()


class Timed:
    """A streamed reply's pieces passed on to ``to``, the moment the first one with content
    passed noted (``at``): the time to first token a client of the stream sees."""

    def __init__(self, to: Any) -> None:
        self.to, self.at = to, None

    def put(self, piece: str) -> None:
        if self.at is None and piece:
            self.at = time.perf_counter()
        self.to(piece)
