"""Shared fixtures: small synthetic trace sets (SYNTHETIC data from ccpo.traces.sim, never LLM
output)."""

from __future__ import annotations

import os

# one thread each for OpenMP (scikit-learn's trees) and OpenBLAS, in this process and every
# process it spawns, set before numpy or scikit-learn load: the suite runs one worker per core
# (-n 2 on 2 cores), and their default of a thread per core each makes 4 spinning threads
# share 2 cores, which slows a small fit several times over
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402 (after the thread settings)

from ccpo.traces.episodes import build_episodes  # noqa: E402
from ccpo.traces.io import write_traces  # noqa: E402
from ccpo.traces.prices import load_prices  # noqa: E402
from ccpo.traces.sim import SimConfig, generate  # noqa: E402

# assertions in the shared helpers explain their failures as the tests' own do
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers.cli import cache_env  # noqa: E402 (after the rewrite hook)

# caches start empty, as on a machine that never ran ccpo, in this process and in every process
# it spawns: matplotlib's font cache, ccpo's response cache, never the developer's ~/.cache
os.environ.update(cache_env())


@pytest.fixture(scope="session")
def prices():
    return load_prices()


@pytest.fixture(scope="session")
def sim_traces():
    return generate(SimConfig(n=300, seed=7))


@pytest.fixture(scope="session")
def sim_episodes(sim_traces, prices):
    return build_episodes(sim_traces, prices)


@pytest.fixture(scope="session")
def sim_file(tmp_path_factory, sim_traces):
    path = tmp_path_factory.mktemp("traces") / "sim.jsonl"
    write_traces(path, sim_traces)
    return path


@pytest.fixture(scope="session")
def pg_cluster():
    """A throw-away PostgreSQL cluster (one per test worker). Skipped where PostgreSQL or
    psycopg is missing, except under ``CI=true``, where that fails: CI must run these."""
    import importlib.util
    import os

    from ccpo.testing.postgres import PostgresCluster, find_pg_bin

    missing = None
    if find_pg_bin() is None:
        missing = "no PostgreSQL (pg_ctl, initdb) on this machine"
    elif importlib.util.find_spec("psycopg") is None:
        missing = "psycopg is not installed (pip install -e '.[dev]')"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing}: the PostgreSQL tests must run in CI")
        pytest.skip(missing)
    with PostgresCluster(fsync=False, in_ram=True) as pg:
        yield pg
