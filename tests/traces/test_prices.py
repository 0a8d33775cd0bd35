"""Price tables: usage × price, merging, and no silent zero for unknown models."""

from __future__ import annotations

import json

import pytest

from ccpo.errors import CCPOError, UnknownModelPriceError
from ccpo.traces.prices import bundled_prices, load_prices


def test_bundled_table_has_dated_sourced_entries():
    t = bundled_prices()
    assert t.price("gpt-4o").input_usd_per_mtok == 2.5
    for name, p in t.models.items():
        assert p.as_of and p.source, name
    assert t.price("llama-2-7b").input_usd_per_mtok == 0.0  # explicit zero for local models


def test_cost_is_usage_times_price():
    t = bundled_prices()
    assert t.cost("gpt-4o", 1_000_000, 0) == pytest.approx(2.5)
    assert t.cost("gpt-4o", 930, 6) == pytest.approx((930 * 2.5 + 6 * 10.0) / 1e6)
    assert t.cost("GPT-4O", 1000, 0) == t.cost("gpt-4o", 1000, 0)


def test_unknown_model_is_an_error_that_says_what_to_do():
    with pytest.raises(UnknownModelPriceError) as ei:
        bundled_prices().cost("my-private-model", 10, 10)
    msg = str(ei.value)
    assert "my-private-model" in msg and "--prices" in msg


def test_price_file_merges_over_bundled(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(
        json.dumps(
            {
                "as_of": "2026-11-01",
                "source": "test",
                "models": {
                    "gpt-4o": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
                    "mine": {"input_usd_per_mtok": 0, "output_usd_per_mtok": 0},
                },
            }
        )
    )
    t = load_prices(f)
    assert t.price("gpt-4o").input_usd_per_mtok == 1.0
    assert t.price("mine").as_of == "2026-11-01"
    assert t.price("gpt-4o-mini").input_usd_per_mtok == 0.15  # bundled entries survive


@pytest.mark.parametrize(
    "content,match",
    [
        ("{", "malformed JSON"),
        (
            json.dumps(
                {
                    "as_of": "x",
                    "source": "y",
                    "models": {"m": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 0}},
                }
            ),
            "models.m.input_usd_per_mtok",
        ),
        (json.dumps({"models": {}}), "as_of"),
    ],
)
def test_bad_price_file(tmp_path, content, match):
    f = tmp_path / "p.json"
    f.write_text(content)
    with pytest.raises(CCPOError, match=match):
        load_prices(f)


def test_layers_merge_in_order_tables_and_files_alike(tmp_path):
    from ccpo.traces.prices import prices_from_mapping, write_price_file

    f = write_price_file(tmp_path / "p.json", {"m": (3.0, 4.0), "gpt-4o": (9.0, 9.0)}, "file")
    own = prices_from_mapping(
        {"as_of": "2026-01-01", "source": "own", "models": {"m": {"input_usd_per_mtok": 1.0,
         "output_usd_per_mtok": 2.0}, "n": {"input_usd_per_mtok": 5.0, "output_usd_per_mtok": 6.0}}}
    )  # fmt: skip
    t = load_prices(own, None, f)  # the file comes last and wins
    assert t.price("m").input_usd_per_mtok == 3.0 and t.price("n").input_usd_per_mtok == 5.0
    assert t.price("gpt-4o").input_usd_per_mtok == 9.0
    assert load_prices(f, own).price("m").input_usd_per_mtok == 1.0
    assert t.sources[0] == "bundled prices" and t.sources[1:] == ["inline prices", str(f)]


def test_a_round_costs_its_base_plus_its_guide(sim_traces):
    t = load_prices()
    for r in sim_traces[0].rounds:
        cb, cg = t.round_costs(r)
        assert cb == t.cost(r.base.model, r.base.usage.input_tokens, r.base.usage.output_tokens)
        assert cg == t.cost(r.guide.model, r.guide.usage.input_tokens, r.guide.usage.output_tokens)
        assert t.round_cost(r) == cb + cg and cg > 0
