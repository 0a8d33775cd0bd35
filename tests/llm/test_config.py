"""Collection settings: the endpoint settings are declared once and shared with deployment."""

from __future__ import annotations

from ccpo.llm.config import CollectConfig, EndpointSettings
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
    }  # fmt: skip
    assert set(values) == set(EndpointSettings.model_fields)
    cc = DeployConfig(task="mmlu", **values).collect_config(3)
    for k, v in values.items():
        got = getattr(cc, k)
        assert (got.get_secret_value() if hasattr(got, "get_secret_value") else got) == v, k
    assert (cc.task, cc.rounds) == ("mmlu", 3)
