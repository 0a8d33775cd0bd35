"""Persistent response cache (stdlib ``sqlite3``): never pay twice for the same call.

The key is the SHA-256 of the canonical JSON of the *full logical request* — model name,
messages, temperature, max tokens, stop sequences, log-prob settings and any extra sampling
parameters — **plus a sample index**. Two requests at temperature 1.0 with different sample
indices are distinct samples; re-running the same collection asks for the same indices and is
served entirely from the cache (zero new calls).

What is *not* in the key: the endpoint URL (moving a model to another host or port keeps its
cache) and the API key. Nothing secret is ever stored: the value is the normalised response
(text, token usage, per-token log-probs, finish reason), the stored request copy holds only the
keyed fields.

Concurrency: one connection guarded by a ``threading.Lock`` (every operation is a few
microseconds, so it is called directly from the event loop); WAL journal so that several
processes may share one cache file; each ``put`` commits at once, so a killed run keeps every
answer it paid for.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError, OutputWriteError

#: SQLite's result codes of a full disk (SQLITE_FULL) and a failed write (SQLITE_IOERR)
_SQLITE_NO_ROOM = frozenset({13, 10})

CACHE_FORMAT = "ccpo.cache/v1"


def cache_key(request: dict[str, Any], sample: int = 0) -> str:
    """SHA-256 hex digest of the canonical request JSON and the sample index.

    ``request`` must not contain credentials (the client builds it from the request fields
    only); keys named like secrets are rejected to make that impossible to get wrong.
    """
    for k in request:
        if k.lower() in ("api_key", "authorization", "key", "headers", "base_url"):
            raise ValueError(f"field '{k}' must not be part of a cache key")
    payload = json.dumps(
        {"format": CACHE_FORMAT, "request": request, "sample": int(sample)},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class ResponseCache:
    """SQLite key → response store. ``ResponseCache(None)`` is a disabled (no-op) cache."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.hits = 0
        self.misses = 0
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, model TEXT, request TEXT, sample INTEGER,"
                " response TEXT NOT NULL, created REAL)"
            )
        except (sqlite3.Error, OSError) as e:
            raise CCPOError(f"{self.path}: cannot open the response cache ({e})") from None
        self._conn = conn

    @property
    def enabled(self) -> bool:
        return self._conn is not None

    def get(self, key: str) -> dict[str, Any] | None:
        if self._conn is None:
            return None
        with self._lock:
            row = self._conn.execute(
                "SELECT response FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, request: dict[str, Any], sample: int, response: dict[str, Any]) -> None:
        if self._conn is None:
            return
        try:
            self._put(key, request, sample, response)
        except sqlite3.Error as e:  # disk full, read-only file system, ...
            full = (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF in _SQLITE_NO_ROOM
            cls = OutputWriteError if full else CCPOError  # exit 1: partial, rerun to finish
            raise cls(f"{self.path}: cannot write the response cache ({e})") from None

    def _put(
        self, key: str, request: dict[str, Any], sample: int, response: dict[str, Any]
    ) -> None:
        assert self._conn is not None
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO responses (key, model, request, sample, response, created)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key,
                    str(request.get("model", "")),
                    json.dumps(request, ensure_ascii=False, sort_keys=True),
                    int(sample),
                    json.dumps(response, ensure_ascii=False),
                    time.time(),
                ),
            )

    def __bool__(self) -> bool:  # an empty cache is still a cache
        return True

    def __len__(self) -> int:
        if self._conn is None:
            return 0
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        if self._conn is not None:
            with self._lock:
                self._conn.close()
            self._conn = None
