"""The end of a total budget in ``ccpo serve``: a question waiting for room that another
replica holds (one that died, until its lease expires) gives up after ``server.budget_wait``
with a JSON 503 ``budget_busy`` naming who holds the room and a ``Retry-After``; and questions
are admitted only when their ladder's worst case fits, so near the end they are refused
before they pay. On SQLite and PostgreSQL (``CI=true``)."""

from __future__ import annotations

import re

import httpx
import pytest

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.service import artifact_fingerprint
from ccpo.runtime.state import StateStore
from tests.helpers.serve import LiveServer, Q, assert_json_error, burst, make_service, post


def _ghost(url: str, policy_dir, usd: float, unrenewed: float) -> None:
    """A replica that reserved ``usd`` for its calls and died ``unrenewed`` seconds ago on a
    host where its process cannot be checked: its lease (600 s) holds the money until then."""
    ghost = StateStore(
        url, artifact_fingerprint(policy_dir), OnlineThreshold(alpha=0.1), expiry=600.0,
        replica="ghost",
    )  # fmt: skip
    assert ghost.money.reserve(usd, None, inflight=usd).result()
    ghost.engine._stop.set()  # no heartbeat, no write any more
    with ghost.db.write() as tx:
        tx.run("UPDATE ccpo_leases SET expires = expires - ? WHERE replica = 'ghost'", (unrenewed,))
    ghost.db.close()


@pytest.mark.parametrize("unrenewed", [0.0, 300.0], ids=["renewed", "dead-300s"])
def test_a_question_waiting_for_a_dead_replicas_money_gives_up_with_retry_after(
    state_url, world, policy_dir, prices_path, unrenewed
):
    """$0.0099 of a $0.01 budget held by a replica that died: a question gets, after
    ``budget_wait`` (1 s here), a JSON 503 ``budget_busy`` that names the replica; when its
    lease has gone unrenewed longer than a heartbeat, ``Retry-After`` is when it expires (it
    used to wait until then: up to the whole expiry, 600 s here)."""
    cap = 0.01
    _ghost(state_url, policy_dir, 0.0099, unrenewed)
    server = {"state": state_url, "budget_wait": 1.0, "reservation_expiry": 600.0}
    svc = make_service(policy_dir, world, prices_path, server, max_cost_total=cap)
    with LiveServer(svc) as ls:
        r = post(ls.url, "/v1/answer", {"question": Q})
        m = httpx.get(ls.url + "/metrics.json").json()
    msg = assert_json_error(r, 503, "no room in the total budget", "ghost")
    assert r.json()["error"]["type"] == "budget_busy"
    after = int(r.headers["Retry-After"])
    if unrenewed:
        assert re.search(r"has not renewed its lease for 30\d s", msg)
        assert 290 <= after <= 302  # when the ghost's lease expires
    else:
        assert "held by questions in flight" in msg and after == 5
    assert m["dollars_spent"] == 0.0 and world.n_requests == 0  # nothing was paid for it


def test_near_the_end_of_a_budget_questions_are_refused_before_they_pay(
    state_url, world, policy_dir, prices_path
):
    """A budget one replica has used, then two replicas started afresh on it with about one
    and a half questions' worth left, 16 questions at once: every dollar spent bought an
    answer, the rest are refused before any call (503), none part way. (Each new replica
    used to run its first question without a wallet, nothing known of what one costs, and
    the two ran out of room part way; now the worst case a question held is in the state.)"""
    kw = {"kappa": 0.0, "max_tokens": 16}  # every question runs its 4 rounds; short replies
    probe = make_service(policy_dir, world, prices_path, {"state": None}, **kw)
    with LiveServer(probe) as ls:
        one = post(ls.url, "/v1/answer", {"question": Q}).json()["cost_usd"]
    cap = 2.5 * one

    def replica(name: str):
        server = {"state": state_url, "replica": name}
        return make_service(policy_dir, world, prices_path, server, max_cost_total=cap, **kw)

    first = replica("r0")
    with LiveServer(first) as ls:  # the budget's first question
        paid = post(ls.url, "/v1/answer", {"question": Q}).json()["cost_usd"]
    first.store.close()
    a, b = replica("r1"), replica("r2")

    with LiveServer(a) as la, LiveServer(b) as lb:
        rs = burst([la.url, lb.url], 16)
        m = httpx.get(la.url + "/metrics.json").json()
    answered = [r.json()["cost_usd"] for r in rs if r.status_code == 200]
    for r in rs:
        if r.status_code != 200:
            assert_json_error(r, 503, "budget")
    assert m["dollars_spent"] <= cap
    # every dollar bought an answer: the first question's and the burst's, none paid part way
    assert m["dollars_spent"] == pytest.approx(paid + sum(answered), rel=1e-9)
