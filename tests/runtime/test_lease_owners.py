"""Who owns a lease of the serve state: a random token per process, not (host, pid). A replica
restarted under its ``--replica`` id settles what its last process left; a second live process
under one id takes the lease over and the first stops; replicas sharing a host name in other
PID namespaces never end each other's leases; a process of this host that exits is settled
without waiting for its lease to expire. On SQLite and PostgreSQL (``CI=true``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.state import StateStore, StateUnavailable, money

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _store(where: str, replica: str, expiry: float = 600.0) -> StateStore:
    return StateStore(where, "fp", OnlineThreshold(alpha=0.1), expiry=expiry, replica=replica)


def _die_holding(where: str, replica: str, usd: float) -> None:
    """A process of its own opens the state as ``replica``, reserves ``usd`` (all of it in
    calls) and dies without a word (``os._exit``: like ``kill -9``)."""
    code = (
        "import os\n"
        "from ccpo.learning.conformal import OnlineThreshold\n"
        "from ccpo.runtime.state import StateStore\n"
        f"s = StateStore({where!r}, 'fp', OnlineThreshold(alpha=0.1), expiry=600.0,"
        f" replica={replica!r})\n"
        f"assert s.money.reserve({usd}, None, inflight={usd}).result()\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": SRC})


def test_a_replica_restarted_under_its_id_settles_what_its_last_process_left(state_url):
    """kill -9 of replica r0 holding $0.5 in calls, then r0 started again (its lease has not
    expired): the new process counts the old one's calls as spent at their worst case at once
    and holds nothing of them; after a clean stop nothing is left reserved (it used to adopt
    the dead lease: the money stayed reserved for good and was never counted as spent)."""
    _die_holding(state_url, "r0", 0.5)
    again = _store(state_url, "r0")
    c = again.counters
    assert c.spent_usd == pytest.approx(0.5)  # at least what the endpoint can have billed
    assert c.reserved_usd == 0.0 and c.inflight_usd == 0.0
    assert [(r, x, y) for r, x, y, _ in again.money.leases()] == [("r0", 0.0, 0.0)]
    assert again.money.reserve(0.25, 1.0, inflight=0.25).result()
    again.money.settle(0.25, 0.125, inflight=0.25)
    again.close()
    third = _store(state_url, "r0")
    try:
        assert third.counters.spent_usd == pytest.approx(0.625)
        assert third.counters.reserved_usd == 0.0 and third.counters.inflight_usd == 0.0
    finally:
        third.close()


def test_a_second_live_process_under_one_replica_id_takes_over_and_the_first_stops(state_url):
    """Two processes started with the same replica id: the later one takes the lease over
    (what the first held counts as spent at its worst case); the first then refuses every
    operation with a message naming the cause, rather than writing over the other's lease."""
    first = _store(state_url, "r0")
    second = None
    try:
        assert first.money.reserve(0.5, None, inflight=0.5).result()
        second = _store(state_url, "r0")
        assert second.counters.spent_usd == pytest.approx(0.5)
        with pytest.raises(StateUnavailable, match="--replica"):
            first.money.reserve(0.1, None, inflight=0.1).result()
        assert "another process" in (first.health() or "")
        assert second.money.reserve(0.1, 1.0, inflight=0.1).result()
        assert [(r, x) for r, x, _, _ in second.money.leases()] == [("r0", pytest.approx(0.1))]
    finally:
        first.close()
        if second is not None:
            second.close()


def test_replicas_sharing_a_host_name_in_other_pid_namespaces_keep_their_leases(
    state_url, monkeypatch
):
    """B runs in another PID namespace on a host of the same name (a container with host
    networking): its pid means nothing in A's namespace. A's heartbeat must not end B's live
    lease (it used to, judging B's pid absent: B's money counted as spent at every beat)."""
    a = _store(state_url, "a")
    boot = Path("/proc/sys/kernel/random/boot_id")
    kernel = boot.read_text().strip() if boot.exists() else "boot"
    other_ns = f"{kernel}/pid:[1]/7/99"  # this kernel, another PID namespace, its pid 7
    with monkeypatch.context() as m:  # what identifies B's process, as seen from A
        m.setattr("os.getpid", lambda: 4_000_000)  # no such pid in A's namespace
        m.setattr(money, "process_identity", lambda: other_ns, raising=False)
        b = _store(state_url, "b")
    try:
        assert b.money.reserve(0.5, 1.0, inflight=0.5).result()
        a.engine._run_batch([], beat=True)  # A's heartbeat
        assert {r for r, *_ in a.money.leases()} == {"a", "b"}
        assert a.counters.spent_usd == 0.0 and a.counters.reserved_usd == pytest.approx(0.5)
        b.money.settle(0.5, 0.1, inflight=0.5)
        b.engine.flush()
        assert b.counters.spent_usd == pytest.approx(0.1)
        assert b.counters.reserved_usd == 0.0
    finally:
        a.close()
        b.close()


def test_a_process_of_this_host_that_exits_is_settled_before_its_lease_expires(state_url):
    """Replica A idle, another process of this host dies holding $0.5 in calls; its lease is
    good for 600 s and A's heartbeat comes every 150 s, yet A's writer sees the process gone
    and ends the lease (its calls counted as spent) without waiting for either."""
    a = _store(state_url, "a")
    try:
        _die_holding(state_url, "ghost", 0.5)
        a.engine.flush()  # A reads the leases once: the ghost holds money
        deadline = time.monotonic() + 20.0  # far below the heartbeat's 150 s
        while "ghost" in {r for r, *_ in a.money.leases()} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {r for r, *_ in a.money.leases()} == {"a"}
        a.refresh()
        assert a.counters.spent_usd == pytest.approx(0.5) and a.counters.reserved_usd == 0.0
    finally:
        a.close()
