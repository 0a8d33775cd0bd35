"""The answered questions in the state store and the feedback on them (:class:`Answers`, the
``answers`` of :class:`~ccpo.runtime.state.store.StateStore`).

Each operation is a :class:`~ccpo.runtime.state.engine.Pending`: a thread takes its
``.result()``, an event loop awaits it.

- :meth:`Answers.record_answer`: store an answer record and count it (an operation that may
  be sent whole: its row goes in before the state row is locked,
  :func:`~ccpo.runtime.state.engine.insert_answers`); a taken id is :class:`DuplicateKey`;
- :meth:`Answers.record_feedback`: one feedback, exactly once over all replicas, moving κ and
  the coverage counters;
- :meth:`Answers.lookup`: a served answer set and its feedback;
- :meth:`Answers.claim`, :meth:`~Answers.unclaim`: an id taken before it is answered (one
  replica answers and pays for it), and given back when its answer fails;
- :meth:`Answers.count_rejected`, :meth:`~Answers.record_error`: request counts kept in memory
  and written with the next transaction;
- the trim: every ``_TRIM_EVERY`` answers, the oldest beyond ``max_records`` go.
"""

from __future__ import annotations

import json
from typing import Any

from ccpo.errors import CCPOError
from ccpo.runtime.feedback import FeedbackError, KappaBounds, apply_feedback
from ccpo.runtime.state.batch import Batch, _Delta, _Op
from ccpo.runtime.state.db import DuplicateKey, Tx, unstorable
from ccpo.runtime.state.engine import CommitEngine, Pending

_TRIM_EVERY = 64  # answers inserted between two trims of the answer table

Stored = tuple[str, dict[str, Any], str | None]  # a served answer: question, record, feedback


class Answers:
    """Answers and feedback of the state store on the commit ``engine``: operations handed to
    it (:meth:`CommitEngine.commit`: each a :class:`Pending`, its ``.result()`` waited for
    or awaited), counts pending in it (:meth:`CommitEngine.pend`).
    Its state: the answers this replica inserted (every ``_TRIM_EVERY``, the oldest beyond
    ``max_records`` go: :meth:`trim`, run by the engine)."""

    def __init__(self, engine: CommitEngine, max_records: int = 100_000) -> None:
        self.engine = engine
        self.max_records = max_records
        self._inserted = 0  # answers this replica inserted (every _TRIM_EVERY: a trim)

    def lookup(self, qid: str) -> Pending[Stored | None]:
        """(question, answer-set JSON, feedback JSON or None) of a served id."""

        def fn(b: Batch) -> Stored | None:
            row = b.tx.one(
                "SELECT question, answer, feedback FROM ccpo_answers WHERE id = ? AND answer <> ''",
                (qid,),
            )
            return None if row is None else (row[0], json.loads(row[1]), row[2])

        return self.engine.commit(fn, read=True)

    def claim(self, qid: str, question: str) -> Pending[Stored | str | None]:
        """Take ``qid`` before answering it, so that one replica answers and pays for it: its
        row goes in with the answer ``''`` (a claim), which :meth:`record_answer` replaces.
        One statement, atomic on its own (the id's key), so without the state row's lock.
        Its result: None (claimed: answer it), the stored answer (as :meth:`lookup` gives
        it), or the id of the replica answering it now (its caller answers 409). A claim
        whose replica holds no live lease (it died or stopped), or older than the lease
        expiry (its answer failed and the claim could not be withdrawn), or this replica's
        own, is taken over."""
        replica, expiry, now = self.engine.replica, self.engine.expiry, self.engine.db.now

        def fn(b: Batch) -> Stored | str | None:
            took = b.tx.all(
                "INSERT INTO ccpo_answers (id, question, answer, replica, created) VALUES "
                f"(?, ?, '', ?, {now}) ON CONFLICT (id) DO UPDATE SET question = "
                "excluded.question, replica = excluded.replica, created = excluded.created "
                "WHERE ccpo_answers.answer = '' AND (ccpo_answers.replica = excluded.replica "
                "OR ccpo_answers.created < excluded.created - ? OR NOT EXISTS (SELECT 1 FROM "
                "ccpo_leases l WHERE l.replica = ccpo_answers.replica AND l.expires >= "
                "excluded.created)) RETURNING id",
                (qid, question, replica, expiry),
            )
            if took:
                return None
            row = b.tx.one(
                "SELECT question, answer, feedback, replica FROM ccpo_answers WHERE id = ?",
                (qid,),
            )
            if row is not None and row[1] != "":
                return row[0], json.loads(row[1]), row[2]
            return "another replica" if row is None else str(row[3])  # (None: just withdrawn)

        return self.engine.commit(fn, read=True)  # (the state row is not written)

    def unclaim(self, qid: str) -> Pending[None]:
        """Withdraw this replica's claim on ``qid`` (its answer failed): the id is free."""

        def fn(b: Batch) -> None:
            b.tx.run(
                "DELETE FROM ccpo_answers WHERE id = ? AND answer = '' AND replica = ?",
                (qid, self.engine.replica),
            )

        return self.engine.commit(fn)

    def trim_due(self, added: int) -> bool:
        """Inserting ``added`` more answers reaches the next trim."""
        return self._inserted // _TRIM_EVERY != (self._inserted + added) // _TRIM_EVERY

    def trim(self, tx: Tx | None, added: int) -> None:
        """``added`` answers went in (in ``tx``; None: a transaction sent whole, where no trim
        is due): every ``_TRIM_EVERY`` answers, the oldest beyond ``max_records`` go."""
        due = self.trim_due(added)
        self._inserted += added
        if not due or tx is None:
            return
        n = int(tx.one("SELECT COUNT(*) FROM ccpo_answers")[0])  # type: ignore[index]
        if n > self.max_records:
            tx.run(
                "DELETE FROM ccpo_answers WHERE id IN (SELECT id FROM ccpo_answers "
                "ORDER BY created ASC LIMIT ?)",
                (n - self.max_records,),
            )

    def record_answer(self, answer: dict[str, Any], text: str | None = None) -> Pending[None]:
        """Store an answered question and count it, durably once committed;
        :class:`DuplicateKey` if its id is taken. ``text``: the record as JSON when the caller
        has it already (``answer`` then needs only the fields counted: id, question, cost_usd,
        answers, rounds)."""
        why = unstorable(answer.get("question", "")) or unstorable(answer.get("id", ""))
        if why:
            raise CCPOError(f"the answer cannot be stored: {why}")

        def fn(b: Batch) -> None:
            if answer["id"] not in b.inserted:  # taken before, or by an earlier op here
                raise DuplicateKey(f"answer id '{answer['id']}' is taken")
            b.inserted.discard(answer["id"])
            c = b.counters
            c.requests += 1
            c.cost_usd += float(answer["cost_usd"])
            c.set_size_sum += len(answer["answers"])
            c.rounds_sum += int(answer["rounds"])

        return Pending(self.engine, _Op(fn, answer=answer, text=text, whole=True))

    def count_rejected(self) -> None:
        """Count a request refused before any work: in memory only (written with this
        replica's next transaction), so that a flood of junk costs no database writes."""
        self.engine.pend(_Delta(rejected=1), lazy=False)

    def record_error(self) -> None:
        """Count a failed request (written with the next transaction, within ``FLUSH_S``)."""
        self.engine.pend(_Delta(errors=1))

    def record_feedback(
        self,
        qid: str,
        covered: bool,
        feedback: dict[str, Any],
        adapt: bool,
        max_step: int | None,
        bounds: KappaBounds | None = None,
    ) -> Pending[tuple[float, int, int]]:
        """Apply one feedback, exactly once over all replicas: coverage counters and (if
        ``adapt``) one κ step within ``bounds`` (:func:`~ccpo.runtime.feedback.
        apply_feedback`). A second feedback for the same id is refused (409) and changes
        nothing. Its result: κ, and the feedbacks and covered ones counted once this one was
        (other operations of the same transaction may follow it)."""

        def fn(b: Batch) -> tuple[float, int, int]:
            row = b.tx.one(
                f"SELECT feedback FROM ccpo_answers WHERE id = ? AND answer <> ''"
                f"{self.engine.db.lock}",
                (qid,),
            )
            if row is None:
                raise FeedbackError(404, f"no answered question with id '{qid}' (or expired)")
            if row[0] is not None:
                raise FeedbackError(409, f"feedback for id '{qid}' was already given")
            b.tx.run(
                "UPDATE ccpo_answers SET feedback = ? WHERE id = ?", (json.dumps(feedback), qid)
            )
            c = b.counters
            apply_feedback(b.tracker, c, covered, adapt, max_step, bounds or KappaBounds())
            return b.tracker.kappa, c.feedback, c.covered

        return self.engine.commit(fn)
