"""Shared fixtures: a small trained policy artifact and the scripted LLM world over HTTP; every
serve test on both stores (helpers: :mod:`tests.helpers.serve`, :mod:`tests.helpers.policies`)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tests.helpers.chat import trained_chat_policies
from tests.helpers.policies import make_policy, make_stop_policy
from tests.helpers.serve import STORE, write_prices
from tests.helpers.world import make_world

# ----------------------------------------------------------------------------- both stores
#: modules whose tests that start ``ccpo serve`` (make_service, the CLI) run on both stores
SERVE_MODULES = (
    "test_server",
    "test_serve_under_attack",
    "test_openai_compat",
    "test_rails",
    "test_cli",
    "test_text_a_database_refuses",
    "test_schema_version_at_every_write",
)
_SERVES = ("make_service", "start_serve", "state_at")


def pytest_generate_tests(metafunc) -> None:
    """Every serve test runs twice: on the embedded SQLite store and on PostgreSQL."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in SERVE_MODULES and "serve_store" in metafunc.fixturenames:
        src = inspect.getsource(metafunc.function)
        if any(name in src for name in _SERVES):
            metafunc.parametrize("serve_store", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(autouse=True)
def serve_store(request):
    """The store serve tests run on (parametrised by :func:`pytest_generate_tests`)."""
    kind = getattr(request, "param", "sqlite")
    STORE.kind, STORE.dbs = kind, {}
    if kind == "postgresql":
        STORE.pg = request.getfixturevalue("pg_cluster")
    yield kind
    STORE.kind, STORE.dbs = "sqlite", {}


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


@pytest.fixture(params=["sqlite", "postgresql"])
def state_url(request, tmp_path) -> str:
    """A fresh state on each store: a SQLite file, a PostgreSQL database (``CI=true``)."""
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    return request.getfixturevalue("pg_cluster").new_database()


# ----------------------------------------------------------------------------- chat
@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    """A CStop policy trained on a chat ladder collected from the scripted chat world (one per
    module that asks for it)."""
    return trained_chat_policies(tmp_path_factory.mktemp("chat"), pol=())
