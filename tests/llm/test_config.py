"""Collection settings: the endpoint settings are declared once and shared with deployment."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccpo.errors import CCPOError
from ccpo.llm.config import CollectConfig, EndpointSettings, build_config
from ccpo.runtime.config import DeployConfig


def test_endpoint_settings_are_declared_once():
    shared = set(EndpointSettings.model_fields)
    assert {"base_model", "guide_url", "guide_api_key", "search", "sample_offset"} <= shared
    for cls in (CollectConfig, DeployConfig):
        assert issubclass(cls, EndpointSettings)
        assert not shared & set(cls.__annotations__), f"{cls.__name__} redeclares a setting"


def test_a_deployment_runs_its_rounds_with_every_endpoint_setting():
    values = {
        "base_model": "b", "base_url": "http://b/v1", "base_key_env": "BK", "base_api_key": "s1",
        "guide_model": "g", "guide_url": "http://g/v1", "guide_key_env": "GK",
        "guide_api_key": "s2", "prices": ["p.json"], "temperature_first": 0.1,
        "temperature_later": 0.7, "max_steps": 3, "max_tokens": 64, "search": "bm25",
        "corpus": "c.jsonl", "sample_offset": 5, "backoff_base": 0.25,
        "endpoints": {"*": {"url": "http://any/v1", "key_env": None, "api_key": None}},
    }  # fmt: skip
    assert set(values) == set(EndpointSettings.model_fields)
    cc = DeployConfig(**values).collect_config("mmlu", 3)
    for k, v in values.items():
        got = getattr(cc, k)
        if k == "endpoints":
            got = {m: e.model_dump() for m, e in got.items()}
        assert (got.get_secret_value() if hasattr(got, "get_secret_value") else got) == v, k
    assert (cc.task, cc.rounds) == ("mmlu", 3)


# ----------------------------------------------------------------------------- config
def test_config_yaml_and_overrides(tmp_path: Path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text(
        "task: mmlu\nrounds: 3\nbase-model: a\nguide_model: b\nconcurrency: 4\n"
        "prices: p.json\npolicy_llm:\n  - {model: pm, url: 'http://x/v1'}\n"
    )
    cfg = build_config(y, {"rounds": 2, "n": None, "out": "o.jsonl"})
    assert (cfg.rounds, cfg.concurrency, cfg.base_model, cfg.prices) == (2, 4, "a", ["p.json"])
    assert cfg.policy_llm[0].model == "pm" and cfg.out == "o.jsonl"
    assert cfg.temperature(1) == 0.0 and cfg.temperature(2) == 1.0
    with pytest.raises(CCPOError, match=r"^--rounds 0: ") as e:  # the flag's value, not y's
        build_config(y, {"rounds": 0})
    assert "c.yaml" not in str(e.value)
    y.write_text("task: mmlu\nconcurrency: 0\n")
    with pytest.raises(CCPOError, match=r"c\.yaml: setting 'concurrency'"):
        build_config(y, {"rounds": 2})
    with pytest.raises(CCPOError, match="no task"):
        build_config(None, {})
    y.write_text("task: mmlu\nbogus: 1\n")
    with pytest.raises(CCPOError, match="bogus"):
        build_config(y, {})


def test_a_bare_model_shorthand_does_not_hide_the_star_endpoint():
    """``base_model``/``guide_model`` that only name the models, beside ``endpoints: {"*":
    ...}``: both models go to the '*' URL (before, to the OpenAI API); a shorthand with its
    own URL or key variable still wins, and an explicit entry wins over both."""
    star = {"*": {"url": "http://star/v1"}}
    bare = DeployConfig(base_model="b", guide_model="g", endpoints=star)
    assert bare.endpoint_for("b").base_url == "http://star/v1"
    assert bare.endpoint_for("g").base_url == "http://star/v1"
    own = DeployConfig(base_model="b", base_url="http://b/v1", guide_model="g",
                       guide_key_env="GK", endpoints=star)  # fmt: skip
    assert own.endpoint_for("b").base_url == "http://b/v1"
    assert own.endpoint_for("g").api_key_env == "GK"
    named = DeployConfig(base_model="b", base_url="http://b/v1",
                         endpoints={**star, "b": {"url": "http://named/v1"}})  # fmt: skip
    assert named.endpoint_for("b").base_url == "http://named/v1"
    alone = DeployConfig(base_model="b")
    assert alone.endpoint_for("b").base_url is None  # the OpenAI API, as before
