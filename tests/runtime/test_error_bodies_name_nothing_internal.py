"""An error body sent to an API client names nothing internal: with the state database away
or an LLM endpoint unreachable, the real ``ccpo serve`` (a subprocess on 127.0.0.1) answers
with a short reason and the request's id; the state database's URL (user, password, host,
port, database) and the endpoint's host and port are in the server log only (the password
never)."""

from __future__ import annotations

import importlib.util
import time

import httpx
import pytest

from ccpo.testing import free_port
from tests.helpers.cli import ENV, start_serve, stop_server, write_deploy_config
from tests.helpers.serve import Q
from tests.helpers.world import make_world

PASSWORD = "pw-hunter2"  # $PGPASSWORD (a URL in a config file may hold none)


@pytest.fixture(scope="module")
def pg():
    """A cluster of this module's own (its test stops it), with a user named as no other."""
    from ccpo.testing.postgres import PostgresCluster, find_pg_bin

    if find_pg_bin() is None or importlib.util.find_spec("psycopg") is None:
        pytest.skip("no PostgreSQL or psycopg on this machine")
    with PostgresCluster(fsync=False, user="statedbadmin", in_ram=True) as cluster:
        yield cluster


def _bodies(url: str) -> list[tuple[str, int, str]]:
    """Every kind of request a client sends, and what came back: (what, status, body)."""
    chat = {"model": "ccpo", "messages": [{"role": "user", "content": Q}]}
    asks = [
        ("POST", "/v1/answer", {"question": Q}),
        ("POST", "/v1/answer", {"question": Q, "id": "q-away-1"}),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/chat/completions", {**chat, "stream": True}),
        ("POST", "/v1/feedback", {"id": "q-away-1", "none_of_them": True}),
        ("GET", "/metrics.json", None),
        ("GET", "/metrics", None),
        ("GET", "/healthz", None),
    ]
    out = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for method, path, body in asks:
            r = http.request(method, path, json=body)
            out.append((f"{method} {path}", r.status_code, r.text))
    return out


def _assert_nothing_internal(bodies, *secrets: str) -> None:
    for what, status, text in bodies:
        for s in secrets:
            assert s not in text, (what, status, s, text)


def test_the_state_database_away_is_a_503_that_names_no_database(
    pg, policy_dir, prices_path, tmp_path
) -> None:
    db = pg.new_database()
    name = db.rsplit("/", 1)[1]
    with make_world() as world:
        cfg = write_deploy_config(tmp_path, world, prices_path,
                                  server={"state": db, "state_timeout": 0.5})  # fmt: skip
        proc, url = start_serve(policy_dir, cfg, free_port(), env={**ENV, "PGPASSWORD": PASSWORD})
        try:
            assert httpx.post(url + "/v1/answer", json={"question": Q}).status_code == 200
            pg.stop_server()
            try:
                time.sleep(0.5)
                bodies = _bodies(url)
            finally:
                pg.start_server()
        finally:
            log = stop_server(proc)
    away = [(w, s, t) for w, s, t in bodies if s == 503 and "state_unavailable" in t]
    assert len(away) >= 4, bodies  # the questions and the feedback, at least
    _assert_nothing_internal(bodies, "statedbadmin", name, str(pg.port), "127.0.0.1", PASSWORD,
                             "postgresql")  # fmt: skip
    assert any("q-away-1" in t for w, _, t in away if "answer" in w), away  # its request id
    assert name in log and PASSWORD not in log  # the operator's log has where, not the password


def test_an_unreachable_endpoint_is_a_502_that_names_no_host_or_port(
    policy_dir, prices_path, tmp_path
) -> None:
    port = free_port()  # nothing listens there: the connection is refused
    with make_world() as world:
        dead = f"http://127.0.0.1:{port}/v1"
        cfg = write_deploy_config(tmp_path, world, prices_path, base_url=dead, guide_url=dead,
                                  max_retries=1)  # fmt: skip
        proc, url = start_serve(policy_dir, cfg, free_port())
        try:
            bodies = _bodies(url)
        finally:
            log = stop_server(proc)
    failed = [(w, s, t) for w, s, t in bodies if s == 502]
    assert len(failed) >= 3 and all("upstream_error" in t for _, _, t in failed), bodies
    _assert_nothing_internal(bodies, str(port), "127.0.0.1")
    assert any("q-away-1" in t for _, _, t in failed), failed  # its request id
    assert f"127.0.0.1:{port}" in log  # the operator's log says which endpoint failed
