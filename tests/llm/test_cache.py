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
