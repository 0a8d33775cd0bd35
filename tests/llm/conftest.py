"""Fixtures: a scripted 'world' of LLM replies served over real HTTP on 127.0.0.1, and a price
file for its models (:mod:`tests.helpers.world`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccpo.traces.prices import write_price_file
from tests.helpers.world import MODELS, make_world


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    return write_price_file(tmp_path / "prices.json", dict.fromkeys(MODELS, (1.0, 4.0)), "test")


@pytest.fixture
def world():
    with make_world() as srv:
        yield srv
