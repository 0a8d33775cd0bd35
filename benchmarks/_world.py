"""The scripted MMLU world of the benchmarks, as a process of its own (like a real LLM server).

    python benchmarks/_world.py LATENCY_S      # prints its base URL on the first line

The base answers ``Answer: <letter>`` after two reasoning steps, the guide says ``Yes`` or
``No [<letter>]``; both are deterministic functions of the prompt (and the base's temperature).
A benchmark starts it with :func:`start_world`, so the load generator and the server do not
share one interpreter's GIL.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

from ccpo.testing.scripted_server import ScriptedServer, prompt_text


def _h(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest()[:8], 16)


def guide(req: dict) -> str:
    t = prompt_text(req)
    return "Yes" if _h(t) % 3 == 0 else "No [" + "ABCD"[_h(t) % 4] + "]"


def base(req: dict) -> str:
    k = _h(prompt_text(req)) + int(req.get("temperature", 0) * 7)
    return "Step 1: think.\nStep 2: check.\nAnswer: " + "ABCD"[k % 4]


def start_world(latency: float) -> tuple[subprocess.Popen, str]:
    """Start this world in a subprocess; returns the process and its base URL (…/v1)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


if __name__ == "__main__":
    srv = ScriptedServer(
        rules=[(r"^Evaluate the answer\.", guide)], fallback=base, latency=float(sys.argv[1])
    ).start()
    print(srv.url, flush=True)
    while True:
        time.sleep(3600)
