"""Test and benchmark helpers that ship with the package: a scripted OpenAI-compatible server
(:mod:`ccpo.testing.scripted_server`), a ``llama_cpp.server`` launcher
(:mod:`ccpo.testing.llama_server`), :func:`wait_for_http` and :func:`free_port`."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def wait_for_http(
    url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0, what: str = "server"
) -> float:
    """Poll ``url`` until it answers 200; seconds waited. Fails fast if ``proc`` has exited."""
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"{what} exited with code {proc.returncode}: {err}")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s")
        time.sleep(0.1)


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
