"""The server's persistent state (stdlib ``sqlite3``): answer sets awaiting feedback, counters,
the running coverage estimate and the online κ tracker.

Feedback on a served question is either its correct answer or "none of them". The question is
**covered** iff the correct answer is one of the returned answers under the task normaliser;
"none of them" is a miss. (Replay also counts unsolvable questions as covered; live, the rounds
that were not run are unknown, so a miss is a miss — the conservative reading.)

κ is updated with the *same* online tracker as training,
:class:`ccpo.learning.conformal.OnlineThreshold` (corrected sign: κ ← κ + η_k(covered − (1 − α)),
η_k = η_0 k^(−1/2−ξ)): a miss lowers κ, so the sets {π ≥ κ} grow; a run of covered questions
raises it. Under drift a step size that decays to zero stops tracking, so η_k stops decaying
after ``max_step`` feedbacks (η_k = η_0 · min(k, max_step)^(−1/2−ξ)); ``max_step=None`` gives
the training schedule exactly.

Every change is one SQLite transaction (an answer record with its counters, or a feedback with
the tracker and counters), so a crash never leaves half of one written. The state file records
a fingerprint of the policy artifact and refuses to be reused with another policy.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold

STATE_FORMAT = "ccpo.serve-state/v1"
RECENT = 200  # feedbacks in the "recent coverage" window


class FeedbackError(CCPOError):
    """Feedback that cannot be applied (unknown id, already given); carries an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Counters:
    requests: int = 0  # answered questions
    errors: int = 0  # questions that failed (upstream, budget)
    rejected: int = 0  # requests refused before any LLM call (validation, auth, rate, budget)
    cost_usd: float = 0.0  # Σ cost_usd of answered questions (usage × price)
    spent_usd: float = 0.0  # dollars actually paid to the endpoints (cache hits free)
    set_size_sum: int = 0
    rounds_sum: int = 0
    feedback: int = 0
    covered: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["recent"] = list(self.recent)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counters:
        d = dict(d)
        recent = deque(d.pop("recent", []), maxlen=RECENT)
        return cls(**d, recent=recent)


class StateStore:
    """SQLite-backed state; ``path=None`` keeps it in memory (lost on restart)."""

    def __init__(
        self,
        path: str | Path | None,
        fingerprint: str,
        tracker: OnlineThreshold,
        max_records: int = 100_000,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                str(self.path) if self.path else ":memory:",
                isolation_level=None,
                check_same_thread=False,
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS answers (id TEXT PRIMARY KEY, question TEXT NOT NULL,"
                " answer TEXT NOT NULL, created REAL NOT NULL, feedback TEXT)"
            )
        except sqlite3.DatabaseError as e:
            raise CCPOError(f"{self.path}: not a usable state file ({e})") from None
        self.max_records = max_records
        kv = dict(self._db.execute("SELECT key, value FROM kv").fetchall())
        if kv:
            if kv.get("format") != STATE_FORMAT:
                raise CCPOError(f"{self.path}: not a ccpo serve state file")
            if kv.get("fingerprint") != fingerprint:
                raise CCPOError(
                    f"{self.path}: this state file belongs to another policy artifact; use "
                    "another --state file (or delete it to start afresh)"
                )
            t = json.loads(kv["tracker"])
            self.tracker = OnlineThreshold(**t)
            self.counters = Counters.from_json(json.loads(kv["counters"]))
            self.restored = True
        else:
            self.tracker = tracker
            self.counters = Counters()
            self.restored = False
            with self._tx():
                self._put("format", STATE_FORMAT)
                self._put("fingerprint", fingerprint)
                self._save()

    # ------------------------------------------------------------------ plumbing
    def _tx(self):
        store = self

        class _Tx:
            def __enter__(self_inner):
                store._lock.acquire()
                store._db.execute("BEGIN IMMEDIATE")

            def __exit__(self_inner, exc_type, *rest):
                try:
                    store._db.execute("ROLLBACK" if exc_type else "COMMIT")
                finally:
                    store._lock.release()

        return _Tx()

    def _put(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

    def _save(self) -> None:
        self._put("tracker", json.dumps(asdict(self.tracker)))
        self._put("counters", json.dumps(self.counters.to_json()))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ reads
    def lookup(self, qid: str) -> tuple[str, dict[str, Any], str | None] | None:
        """(question, answer-set JSON, feedback JSON or None) of a served id."""
        with self._lock:
            row = self._db.execute(
                "SELECT question, answer, feedback FROM answers WHERE id = ?", (qid,)
            ).fetchone()
        if row is None:
            return None
        return row[0], json.loads(row[1]), row[2]

    @property
    def kappa(self) -> float:
        return self.tracker.kappa

    # ------------------------------------------------------------------ writes
    def record_answer(self, answer: dict[str, Any], spent_usd: float) -> None:
        """Store an answered question and update the counters, in one transaction."""
        c = self.counters
        before = Counters.from_json(c.to_json())
        try:
            with self._tx():
                self._db.execute(
                    "INSERT INTO answers (id, question, answer, created) VALUES (?, ?, ?, ?)",
                    (answer["id"], answer["question"], json.dumps(answer), time.time()),
                )
                c.requests += 1
                c.cost_usd += float(answer["cost_usd"])
                c.spent_usd = spent_usd
                c.set_size_sum += len(answer["answers"])
                c.rounds_sum += int(answer["rounds"])
                self._save()
                n = self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
                if n > self.max_records:
                    self._db.execute(
                        "DELETE FROM answers WHERE id IN (SELECT id FROM answers ORDER BY "
                        "created ASC LIMIT ?)",
                        (n - self.max_records,),
                    )
        except BaseException:
            self.counters = before
            raise

    def record_error(self, spent_usd: float, rejected: bool = False) -> None:
        """Count a failed (or refused) request and persist the dollars paid so far."""
        c = self.counters
        before = Counters.from_json(c.to_json())
        try:
            with self._tx():
                if rejected:
                    c.rejected += 1
                else:
                    c.errors += 1
                c.spent_usd = spent_usd
                self._save()
        except BaseException:
            self.counters = before
            raise

    def record_feedback(
        self,
        qid: str,
        covered: bool,
        feedback: dict[str, Any],
        adapt: bool,
        max_step: int | None,
    ) -> float:
        """Apply one feedback: coverage counters and (if ``adapt``) one κ step. Returns κ."""
        c = self.counters
        before_c = Counters.from_json(c.to_json())
        before_t = asdict(self.tracker)
        try:
            with self._tx():
                row = self._db.execute(
                    "SELECT feedback FROM answers WHERE id = ?", (qid,)
                ).fetchone()
                if row is None:
                    raise FeedbackError(404, f"no answered question with id '{qid}' (or expired)")
                if row[0] is not None:
                    raise FeedbackError(409, f"feedback for id '{qid}' was already given")
                self._db.execute(
                    "UPDATE answers SET feedback = ? WHERE id = ?", (json.dumps(feedback), qid)
                )
                c.feedback += 1
                c.covered += int(covered)
                c.recent.append(int(covered))
                if adapt:
                    if max_step is not None:
                        self.tracker.step = min(self.tracker.step, max_step - 1)
                    self.tracker.update(float(covered))
                self._save()
        except BaseException:
            self.counters = before_c
            self.tracker = OnlineThreshold(**before_t)
            raise
        return self.tracker.kappa
