"""Clients asking questions of a running ``ccpo serve`` while something else happens (an
attack, a fault): what they got, and what ``/healthz`` said meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tests.helpers.serve import Q


def ask_while(
    url: str, during: Callable[[], None], clients: int = 8
) -> tuple[list[httpx.Response], list[str]]:
    """``clients`` threads ask questions (distinct ids) one after the other while
    ``during()`` runs, and ``/healthz`` is polled; returns every answer's response and every
    health status seen (each client asks at least once)."""
    answers: list[httpx.Response] = []
    health: list[str] = []
    done = threading.Event()

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            i = 0
            while not done.is_set() or i == 0:
                body = {"question": f"{Q}\n(client {k}, question {i})", "id": f"c{k}-{i}"}
                answers.append(http.post("/v1/answer", json=body))
                i += 1

    def watch() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not done.is_set():
                health.append(http.get("/healthz").json()["status"])
                done.wait(0.05)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    threads.append(threading.Thread(target=watch))
    for t in threads:
        t.start()
    try:
        during()
    finally:
        done.set()
        for t in threads:
            t.join(60)
    return answers, health
