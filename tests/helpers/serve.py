"""``ccpo serve``'s app under uvicorn in a thread, the deploy settings and prices it runs
with against the scripted world, the store the running test serves on (``state_at``), and
HTTP calls to it (``Q``, ``post``, ``burst``, ``assert_json_error``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import httpx

from ccpo.traces.prices import write_price_file

#: the models a deployed policy calls (base and guide of the scripted world)
MODELS = ("base-m", "guide-m")
Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
#: ``feedback_per_minute`` that never refuses a test's feedback (None, no limit at all, needs
#: the bearer token)
FEEDBACK_UNLIMITED = 1e9


def post(url: str, path: str, body, token: str | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, dict | list):
        return httpx.post(url + path, json=body, headers=headers, timeout=30, **kw)
    return httpx.post(url + path, content=body, headers=headers, timeout=30, **kw)


def burst(urls: list[str], n: int) -> list[httpx.Response]:
    """``n`` questions at once (``Q #i``), round-robin over ``urls``, like a load balancer."""
    import asyncio

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(
                *(
                    http.post(urls[i % len(urls)] + "/v1/answer", json={"question": f"{Q} #{i}"})
                    for i in range(n)
                )
            )

    return asyncio.run(go())


def assert_json_error(r: httpx.Response, status: int, *needles: str) -> str:
    """``r`` is ``status`` with ccpo's JSON error body, every needle in its message."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    msg = r.json()["error"]["message"]
    for n in needles:
        assert n in msg, (n, msg)
    return msg


class _Store:
    """The store of the running test: ``state_at(tmp_path, name)`` is where a state named
    ``name`` lives (the same place every time within a test, so restarts find it)."""

    kind = "sqlite"
    pg = None
    dbs: ClassVar[dict[str, str]] = {}

    def default(self) -> str | None:
        return None if self.kind == "sqlite" else self.at(None, "default")

    def at(self, tmp_path: Path | None, name: str) -> str:
        if self.kind == "sqlite":
            assert tmp_path is not None
            return str(tmp_path / name)
        if name not in self.dbs:
            self.dbs[name] = self.pg.new_database()
        return self.dbs[name]


#: set by the ``serve_store`` fixture of ``tests/runtime/conftest.py``
STORE = _Store()


def state_at(tmp_path: Path, name: str = "state.sqlite") -> str:
    """The state location named ``name`` on the running test's store (a SQLite file in
    ``tmp_path``, or a PostgreSQL database of the test cluster)."""
    return STORE.at(tmp_path, name)


def write_prices(path: Path, models=MODELS, inp: float = 1.0, out: float = 4.0) -> Path:
    write_price_file(path, dict.fromkeys(models, (inp, out)), "test")
    return path


def deploy_values(srv, prices: Path, **kw) -> dict:
    values = dict(
        task="mmlu",
        base_model="base-m",
        base_url=srv.url,
        guide_model="guide-m",
        guide_url=srv.url,
        prices=[str(prices)],
        timeout=5.0,
        backoff_base=0.005,
    )
    values.update(kw)
    return values


class LiveServer:
    """``ccpo serve``'s app under uvicorn in a thread, on a free port of 127.0.0.1."""

    def __init__(self, service) -> None:
        import socket
        import threading

        import uvicorn

        from ccpo.runtime.server import uvicorn_config

        self.service = service
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # the server's own uvicorn settings (proxy headers, ...), on this socket
        self.server = uvicorn.Server(uvicorn_config(service, log_level="warning"))
        self._thread = threading.Thread(
            target=lambda: self.server.run(sockets=[self._sock]), daemon=True
        )

    def __enter__(self) -> LiveServer:
        import time

        self._thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if time.monotonic() - t0 > 20 or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()


def make_service(policy_dir: Path, srv, prices: Path, server: dict | None = None, **kw):
    from ccpo.runtime.config import load_deploy_config
    from ccpo.runtime.server import Service

    values = deploy_values(srv, prices, **kw)
    values["server"] = dict(server or {})
    values["server"].setdefault("state", STORE.default())
    return Service.from_artifact(policy_dir, load_deploy_config(None, values))
