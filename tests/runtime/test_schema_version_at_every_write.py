"""A replica checks the state's schema version in every transaction: once a newer ccpo has
converted the tables (simulated by raising the version in the database, and by changing a
table as a conversion would), the running replica writes nothing more and answers every
request with a JSON 503 naming both versions and what to do (it used to go on writing, or
answer bare 500s); ``/healthz`` says degraded; it serves again if the version comes back.
On the embedded SQLite store and on PostgreSQL."""

from __future__ import annotations

import time

import httpx
import pytest

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.state import SCHEMA_VERSION, StateStore, StateUnavailable
from ccpo.runtime.state.backends import open_backend
from tests.helpers.serve import LiveServer, Q, assert_json_error, make_service, post, state_at

NEWER = str(SCHEMA_VERSION + 1)


def convert(location: str, *statements: str) -> None:
    """What a newer ccpo's conversion leaves: the version raised, and ``statements`` run."""
    db = open_backend(location)
    try:
        with db.write() as tx:
            for sql in statements:
                tx.run(sql)
    finally:
        db.close()


def set_version(version: str) -> str:
    return f"UPDATE ccpo_meta SET value = '{version}' WHERE key = 'schema_version'"


def test_a_replica_refuses_to_write_into_a_newer_schema(world, policy_dir, prices_path, tmp_path):
    """After the conversion: questions and feedback get the JSON 503 (no LLM call is made),
    ``/healthz`` is degraded with the same reason; with the version back, it serves."""
    location = state_at(tmp_path, "s.db")
    svc = make_service(policy_dir, world, prices_path, {"state": location})
    with LiveServer(svc) as ls:
        url = ls.url
        assert post(url, "/v1/answer", {"question": Q, "id": "q1"}).status_code == 200
        assert post(url, "/v1/answer", {"question": Q + " ", "id": "q2"}).status_code == 200
        convert(location, set_version(NEWER))
        calls = world.n_requests
        asked = post(url, "/v1/answer", {"question": Q + "  ", "id": "q3"})
        fed = post(url, "/v1/feedback", {"id": "q1", "none_of_them": True})
        health = httpx.get(url + "/healthz")
        m = httpx.get(url + "/metrics.json")
        paid = world.n_requests - calls
        convert(location, set_version(str(SCHEMA_VERSION)))
        for _ in range(100):  # the writer probes the database again within a second
            again = post(url, "/v1/answer", {"question": Q, "id": "q1"})
            if again.status_code == 200:
                break
            time.sleep(0.05)
    needles = (f"schema version {NEWER}", f"this replica's ({SCHEMA_VERSION})", "Upgrading")
    for r in (asked, fed, m):
        assert_json_error(r, 503, *needles)
        assert r.json()["error"]["type"] == "state_unavailable"
    assert paid == 0  # refused before any LLM call
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert f"schema version {NEWER}" in health.json()["detail"]
    assert again.status_code == 200


def test_a_conversion_that_changed_a_table_is_named_not_a_bare_error(tmp_path, serve_store):
    """A conversion that renamed a column the replica writes: its next write fails in the
    database, and the replica says why (the versions), as a :class:`StateUnavailable`."""
    location = state_at(tmp_path, "s.db")
    store = StateStore(location, "fp", OnlineThreshold(alpha=0.1), replica="a")
    try:
        record = {"id": "q1", "question": Q, "cost_usd": 0.0, "answers": ["C"], "rounds": 1}
        store.answers.record_answer(record).result()
        convert(
            location,
            set_version(NEWER),
            "ALTER TABLE ccpo_answers RENAME COLUMN replica TO served_by",
        )
        with pytest.raises(StateUnavailable, match=f"schema version {NEWER}, newer than"):
            store.answers.record_answer({**record, "id": "q2"}).result()
        assert f"schema version {NEWER}" in (store.health() or "")
    finally:
        store.close()
