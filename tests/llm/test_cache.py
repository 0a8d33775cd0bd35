"""The response cache's keys: sample index and request fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccpo.llm.cache import ResponseCache, cache_key
from ccpo.llm.client import ChatRequest


# ----------------------------------------------------------------------------- cache keys
def test_cache_key_sample_index_and_fields(tmp_path: Path) -> None:
    req = ChatRequest([{"role": "user", "content": "hi"}], temperature=1.0)
    f = req.key_fields("m")
    assert cache_key(f, 0) != cache_key(f, 1)
    assert cache_key(f, 1) == cache_key(dict(reversed(list(f.items()))), 1)
    for change in (
        {"temperature": 0.5},
        {"max_tokens": 7},
        {"stop": ["x"]},
        {"logprobs": False},
        {"model": "n"},
    ):
        assert cache_key({**f, **change}, 0) != cache_key(f, 0)
    with pytest.raises(ValueError):
        cache_key({**f, "api_key": "sk-1"}, 0)
    c = ResponseCache(tmp_path / "c.sqlite")
    c.put(cache_key(f, 0), f, 0, {"text": "a"})
    assert c.get(cache_key(f, 0)) == {"text": "a"} and c.get(cache_key(f, 1)) is None
    assert len(c) == 1
    c.close()
    disabled = ResponseCache(None)
    disabled.put("k", f, 0, {"text": "a"})
    assert disabled.get("k") is None and not disabled.enabled


def test_the_in_flight_key_tells_requests_apart_as_the_cache_key_does() -> None:
    """Without a cache, a request in flight is matched by a tuple (no digest): every field
    that changes the cache key changes it, and only those (the ladder step does not)."""
    req = ChatRequest([{"role": "user", "content": "hi"}], temperature=1.0, step={"round": "1"})
    key = req.flight_key("m", 0)
    assert key == ChatRequest([{"role": "user", "content": "hi"}], 1.0).flight_key("m", 0)
    assert hash(key) == hash(req.flight_key("m", 0))
    changed = [
        ChatRequest([{"role": "user", "content": "ho"}], 1.0),
        ChatRequest([{"role": "system", "content": "hi"}], 1.0),
        ChatRequest([{"role": "user", "content": "hi"}], 0.5),
        ChatRequest([{"role": "user", "content": "hi"}], 1.0, max_tokens=7),
        ChatRequest([{"role": "user", "content": "hi"}], 1.0, stop=["x"]),
        ChatRequest([{"role": "user", "content": "hi"}], 1.0, logprobs=False),
        ChatRequest([{"role": "user", "content": "hi"}], 1.0, top_logprobs=2),
    ]
    for other in changed:
        assert other.flight_key("m", 0) != key
        assert cache_key(other.key_fields("m"), 0) != cache_key(req.key_fields("m"), 0)
    assert req.flight_key("n", 0) != key and req.flight_key("m", 1) != key
    # without log-probs, top_logprobs is in neither key
    a = ChatRequest([{"role": "user", "content": "hi"}], logprobs=False, top_logprobs=2)
    b = ChatRequest([{"role": "user", "content": "hi"}], logprobs=False, top_logprobs=5)
    assert a.flight_key("m", 0) == b.flight_key("m", 0)
    assert cache_key(a.key_fields("m"), 0) == cache_key(b.key_fields("m"), 0)
