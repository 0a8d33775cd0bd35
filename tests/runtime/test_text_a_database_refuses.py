"""Text a database refuses (a NUL character: PostgreSQL; a lone surrogate: both), in any
string field of any request, is a 422 naming the field before any write; and an operation
the database refuses anyway fails alone: the other operations of its transaction commit,
``/healthz`` stays ok. On the embedded SQLite store and on PostgreSQL."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.state import StateStore, StateUnavailable
from tests.helpers.serve import LiveServer, Q, assert_json_error, make_service, post, state_at
from tests.helpers.serve_load import ask_while


def _raw(url: str, path: str, text: str) -> httpx.Response:
    """A JSON body sent as written (``\\ud800`` escapes stay lone surrogates)."""
    headers = {"content-type": "application/json"}
    return httpx.post(url + path, content=text.encode(), headers=headers, timeout=30)


def test_feedback_text_a_database_refuses_is_a_422_naming_the_field(
    world, policy_dir, prices_path, tmp_path
):
    """A NUL or a lone surrogate in a feedback's id or correct answer, or in any text field
    of a question (chat messages included): 422 naming the field, nothing written; the
    server stays healthy and answers the next question."""
    svc = make_service(policy_dir, world, prices_path, {"state": state_at(tmp_path, "s.db")})
    with LiveServer(svc) as ls:
        url = ls.url
        served = post(url, "/v1/answer", {"question": Q, "id": "q1"})
        assert served.status_code == 200, served.text
        n0 = world.n_requests
        refused = {
            "id": post(url, "/v1/feedback", {"id": "a\x00b", "none_of_them": True}),
            "correct_answer": post(url, "/v1/feedback", {"id": "q1", "correct_answer": "C\x00"}),
            "messages.0.content": post(
                url,
                "/v1/chat/completions",
                {
                    "model": "ccpo",
                    "messages": [
                        {"role": "system", "content": "x\x00"},
                        {"role": "user", "content": Q},
                    ],
                },
            ),
            "ccpo.context.0.title": post(
                url,
                "/v1/chat/completions",
                {
                    "model": "ccpo",
                    "messages": [{"role": "user", "content": Q}],
                    "ccpo": {"context": [{"title": "t\x00", "text": "p"}]},
                },
            ),
        }
        surrogate = _raw(url, "/v1/feedback", '{"id": "a\\ud800", "none_of_them": true}')
        health = httpx.get(url + "/healthz").json()
        fb = post(url, "/v1/feedback", {"id": "q1", "correct_answer": "C"})
        m = httpx.get(url + "/metrics.json").json()
    for field, r in refused.items():
        assert_json_error(r, 422, f"{field}: it contains a NUL character")
    assert_json_error(surrogate, 422, "id: it contains a lone surrogate")
    assert world.n_requests == n0  # no LLM call for the refused questions
    assert health["status"] == "ok"
    assert fb.status_code == 200 and fb.json()["feedback"] == 1  # nothing else was written
    assert m["rejected"] == 5


def test_a_nul_feedback_flood_leaves_other_clients_answered(
    world, policy_dir, prices_path, tmp_path
):
    """The audit's flood (NUL feedback ids, inside the default rate limit) while other
    clients ask: every feedback is a 422, every question is answered, ``/healthz`` ok all
    along (on PostgreSQL each used to fail its whole transaction: 503s for the others)."""
    conf = {"state": state_at(tmp_path, "s.db"), "feedback_per_minute": 6000, "feedback_burst": 100}
    svc = make_service(policy_dir, world, prices_path, conf)
    with LiveServer(svc) as ls:
        flood: list[httpx.Response] = []

        def attack() -> None:
            for i in range(24):
                flood.append(
                    post(ls.url, "/v1/feedback", {"id": f"x{i}\x00", "none_of_them": True})
                )

        answers, health = ask_while(ls.url, attack, clients=8)
    assert [r.status_code for r in flood] == [422] * 24
    assert answers and all(r.status_code == 200 for r in answers), {
        r.status_code: r.text[:200] for r in answers
    }
    assert set(health) == {"ok"}


@pytest.mark.parametrize("bad", ["a\ud800", "a\x00b"])
def test_an_operation_the_database_refuses_fails_alone(tmp_path, serve_store, bad):
    """An operation that fails in the database (here a lookup of an id it cannot take,
    sent past the checks) gets its own error; the operations of the same transaction
    commit, and the store is not considered away."""
    location = state_at(tmp_path, "s.db")
    store = StateStore(location, "fp", OnlineThreshold(alpha=0.1), replica="a")
    try:
        store.answers.record_answer(
            {"id": "q1", "question": Q, "cost_usd": 0.0, "answers": ["C"], "rounds": 1}
        ).result()
        feedback = store.answers.record_feedback("q1", True, {"none_of_them": False}, False, None)
        ops = {
            "bad": store.answers.lookup(bad).op,
            "feedback": feedback.op,
            "lookup": store.answers.lookup("q1").op,
        }
        for op in ops.values():
            op.fut = concurrent.futures.Future()
        c0 = store.engine.commits
        store.engine._run_batch(list(ops.values()))  # one batch, as the writer runs it
        results = {k: op.fut.exception() or op.fut.result() for k, op in ops.items()}
        assert results["lookup"][0] == Q and results["lookup"][2] is not None
        assert results["feedback"][1] == 1  # (κ, feedbacks, covered)
        if store.db.kind == "sqlite" and "\x00" in bad:  # SQLite stores a NUL: no such id
            assert results["bad"] is None
        else:
            assert isinstance(results["bad"], CCPOError), results["bad"]
            assert not isinstance(results["bad"], StateUnavailable)
        assert store.health() is None
        assert store.engine.commits == c0 + 1
    finally:
        store.close()
