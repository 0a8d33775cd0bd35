"""``ccpo collect`` against the scripted world: its config, the collect commands in an app of
their own, a collector killed midway, and checks of the traces it wrote."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

from ccpo.cli.collect import register
from ccpo.llm.config import build_config
from ccpo.traces.io import iter_traces, read_traces


def cfg_for(srv, tmp: Path, prices: Path, task: str, **kw):
    values = dict(
        task=task,
        n=4,
        rounds=4,
        base_model="base-m",
        base_url=srv.url,
        guide_model="guide-m",
        guide_url=srv.url,
        out=str(tmp / f"{task}.jsonl"),
        cache=str(tmp / "cache.sqlite"),
        prices=[str(prices)],
        concurrency=4,
        timeout=5.0,
        backoff_base=0.005,
    )
    values.update(kw)
    return build_config(None, values)


def ids_of(path: Path) -> list[str]:
    return [t.id for t in iter_traces(path)]


def check_traces(path: Path, n: int, rounds: int = 4) -> list:
    traces = read_traces(path)  # validates the schema
    ids = [t.id for t in traces]
    assert len(ids) == n and len(set(ids)) == n
    for t in traces:
        assert t.n_rounds == rounds
        for r in t.rounds:
            assert r.base.usage.input_tokens > 0 and r.guide.usage.output_tokens > 0
            assert r.base.logprob_mean is not None and r.guide.uncertainty is not None
            assert 0.0 <= r.guide.uncertainty <= 1.0
    return traces


def collect_app() -> typer.Typer:
    """The ``collect`` commands in a typer app of their own."""
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # keep typer in multi-command mode
        pass

    return app


def kill9_after_lines(cfg, lines: int, timeout: float = 60.0) -> None:
    """Run ``collect(cfg)`` in a child process and ``kill -9`` it once ``cfg.out`` holds
    ``lines`` lines."""
    out = Path(cfg.out)
    script = (
        "import json, sys\n"
        "from ccpo.llm.collect import collect\n"
        "from ccpo.llm.config import CollectConfig\n"
        "collect(CollectConfig.model_validate(json.loads(sys.argv[1])), progress=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, cfg.model_dump_json()])
    try:
        deadline = time.monotonic() + timeout
        while not out.exists() or out.read_text().count("\n") < lines:
            assert proc.poll() is None, "the collector ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
