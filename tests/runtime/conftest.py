"""Shared fixtures: a small trained policy artifact and the scripted LLM world over HTTP."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from ccpo.learning.policy import TrainedPolicy
from ccpo.learning.trainers import TrainConfig, train
from ccpo.traces.episodes import build_episodes
from ccpo.traces.prices import load_prices, write_price_file
from ccpo.traces.sim import SimConfig, generate
from tests.llm.conftest import make_world

MODELS = ("base-m", "guide-m")

# ----------------------------------------------------------------------------- both stores
#: modules whose tests that start ``ccpo serve`` (make_service, the CLI) run on both stores
SERVE_MODULES = ("test_server", "test_hardening", "test_openai_compat", "test_rails", "test_cli")
_SERVES = ("make_service", "_start_serve", "state_at")


def pytest_generate_tests(metafunc) -> None:
    """Every serve test runs twice: on the embedded SQLite store and on PostgreSQL."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in SERVE_MODULES and "serve_store" in metafunc.fixturenames:
        src = inspect.getsource(metafunc.function)
        if any(name in src for name in _SERVES):
            metafunc.parametrize("serve_store", ["sqlite", "postgresql"], indirect=True)


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


STORE = _Store()


@pytest.fixture(autouse=True)
def serve_store(request):
    """The store serve tests run on (parametrised by :func:`pytest_generate_tests`)."""
    kind = getattr(request, "param", "sqlite")
    STORE.kind, STORE.dbs = kind, {}
    if kind == "postgresql":
        STORE.pg = request.getfixturevalue("pg_cluster")
    yield kind
    STORE.kind, STORE.dbs = "sqlite", {}


def state_at(tmp_path: Path, name: str = "state.sqlite") -> str:
    """The state location named ``name`` on the running test's store (a SQLite file in
    ``tmp_path``, or a PostgreSQL database of the test cluster)."""
    return STORE.at(tmp_path, name)


def write_prices(path: Path, models=MODELS, inp: float = 1.0, out: float = 4.0) -> Path:
    write_price_file(path, dict.fromkeys(models, (inp, out)), "test")
    return path


def make_policy(folder: Path, method: str = "ccpo", steps: int = 30) -> Path:
    """Train a tiny policy on synthetic traces (T = 4) and save it as an artifact."""
    traces = generate(SimConfig(n=300, seed=0))
    prices = load_prices()
    ep = build_episodes(traces, prices)
    cfg = TrainConfig(method=method, alpha=0.1, steps=steps, val_every=0, seed=0)
    res = train(ep, np.arange(200), cfg)
    variant = "ccpo" if method == "ccpo" else "cpo"
    pol = TrainedPolicy.from_result(res, variant, prices.to_price_file())
    if pol.scoring == "batch":
        pol.kappa_batch = 0.3
    pol.save(folder)
    return folder


def make_stop_policy(folder: Path, method: str = "cstop") -> Path:
    """Fit a replay-trained stopping policy (CStop) on the same synthetic traces and save it."""
    from ccpo.learning.stopping import stopping_fitter

    prices = load_prices()
    ep = build_episodes(generate(SimConfig(n=300, seed=0)), prices)
    pol = stopping_fitter(method)(ep, np.arange(200), 0.1, 0)
    pol.prices = prices.to_price_file()
    pol.kappa_batch = 0.3
    pol.save(folder)
    return folder


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory) -> Path:
    return make_policy(tmp_path_factory.mktemp("policy") / "ccpo")


@pytest.fixture(scope="session")
def cstop_dir(tmp_path_factory) -> Path:
    return make_stop_policy(tmp_path_factory.mktemp("policy") / "cstop")


@pytest.fixture(params=["ccpo", "cstop"])
def any_policy_dir(request, policy_dir, cstop_dir) -> Path:
    """Both kinds of artifact: a CCPO network and a CStop classifier."""
    return policy_dir if request.param == "ccpo" else cstop_dir


@pytest.fixture(scope="session")
def prices_path(tmp_path_factory) -> Path:
    return write_prices(tmp_path_factory.mktemp("prices") / "prices.json")


@pytest.fixture
def world():
    with make_world() as srv:
        yield srv


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


def without(tmp_path: Path, *modules: str, env: dict | None = None) -> dict:
    """The environment of a subprocess in which ``modules`` (and their submodules) cannot be
    imported, as in an install without the extras that bring them: a ``sitecustomize`` on
    PYTHONPATH puts a finder first on ``sys.meta_path`` that refuses them as not installed."""
    import os

    site = tmp_path / "no-extras"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {tuple(modules)!r}\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == m or name.startswith(m + '.') for m in BLOCKED):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
    )
    base = dict(os.environ if env is None else env)
    root = str(Path(__file__).resolve().parents[2])
    return {**base, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(site), root])}
