"""A chat world: conversations as an app exports them (a system prompt, two earlier turns, a
follow-up that means nothing without them), a scripted reply per model that depends on the
whole conversation, and a small chat ladder collected from it, for the chat tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ccpo.traces.prices import write_price_file

SYSTEM = "You are the support bot of Acme.\n  Keep replies short."
LADDER = [
    {"base": "small-m", "guide": "mid-m", "verdict": "agree"},
    {"base": "mid-m", "guide": "big-m", "verdict": "agree"},
]
#: share of conversations (in %) whose reply a model gets right (= the same text as big-m's)
SKILL = {"small-m": 45, "mid-m": 75, "big-m": 100}


def conversation(i: int) -> list[dict[str, str]]:
    """Conversation ``i``: every one ends in the same follow-up, "Same options."."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"My order {i} is late. Options?"},
        {"role": "assistant", "content": f"For order {i}: refund, or wait two days.\n"},
        {"role": "user", "content": "Same options."},
    ]


def write_conversations(path: Path, n: int) -> Path:
    """``n`` conversations as JSONL ``{"id", "messages"}``, as a chat app exports them."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"conv-{i}", "messages": conversation(i)}) + "\n")
    return path


def order_of(messages: list[dict]) -> int:
    """The order number a conversation is about (from its first user turn)."""
    first = next(m["content"] for m in messages if m["role"] == "user")
    return int(first.split()[2])


def chat_reply(req: dict) -> str:
    """A model's reply to a conversation: the right one (with white space around it that must
    survive) on :data:`SKILL` % of orders, else a wrong one of its own. A conversation without
    its history gets a reply that says so."""
    msgs, model = req["messages"], req["model"]
    if not any(m["role"] == "assistant" for m in msgs):
        return "Which options? I have no earlier message."
    i = order_of(msgs)
    h = int(hashlib.sha256(f"{model}/{i}".encode()).hexdigest()[:4], 16) % 100
    if h < SKILL.get(model, 100):
        return f"  Order {i}: a refund, or wait two days.\n\nAnything else?\n"
    return f"{model}: please wait for order {i}."


def chat_prices(path: Path) -> Path:
    write_price_file(path, {"small-m": (0.1, 0.4), "mid-m": (1.0, 4.0), "big-m": (5.0, 20.0)}, "t")
    return path


def collect_values(srv, tmp: Path, n: int, **kw) -> dict:
    """``ccpo collect`` settings of the chat ladder against ``srv`` (labels: big-m's reply)."""
    values = dict(
        task="chat",
        data=str(write_conversations(tmp / "conversations.jsonl", n)),
        ladder=LADDER,
        endpoints={"*": {"url": srv.url}},
        reference="big-m",
        prices=[str(chat_prices(tmp / "prices.json"))],
        out=str(tmp / "chat.jsonl"),
        no_cache=True,
        concurrency=16,
        timeout=5.0,
        backoff_base=0.005,
    )
    values.update(kw)
    return values


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 in front of an OpenAI-compatible server (a real one, such as
    ``llama_cpp.server``, which keeps no record of what it was sent): every POST body is kept
    in ``requests`` (parsed JSON, in arrival order) and forwarded unchanged; the reply comes
    back as the server gave it (and is kept in ``replies``). One request at a time is enough
    for the tests that use it (the lists are appended from the handler threads)."""

    def __init__(self, upstream: str) -> None:
        import threading
        import urllib.error
        import urllib.request
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict] = []
        self.replies: list[dict] = []  # the upstream's JSON replies, in the same order
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # silence
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests.append(json.loads(body))
                url = upstream.rstrip("/") + self.path.removeprefix("/v1")
                req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                proxy.replies.append(json.loads(data) if status == 200 else {})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        # shutdown() waits for the loop's next poll: every 50 ms, not the default 0.5 s
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def trained_chat_policies(d: Path, **answers: tuple[str, ...]) -> Path:
    """In ``d``: the scripted chat world's ladder collected (120 conversations, ``chat.jsonl``
    and ``prices.json``) and a CStop policy trained on it at α = 0.2 per ``name=(extra train
    arguments)``, in ``d / name``."""
    from ccpo.llm.collect import collect
    from ccpo.llm.config import build_config
    from ccpo.testing.scripted_server import ScriptedServer
    from tests.helpers.cli import ccpo_ok

    with ScriptedServer(fallback=chat_reply) as srv:
        assert collect(build_config(None, collect_values(srv, d, 120)), progress=False).done
    for name, extra in answers.items():
        ccpo_ok("train", "--traces", str(d / "chat.jsonl"), "--prices", str(d / "prices.json"),
                "--method", "cstop", "--alpha", "0.2", *extra, "--out", str(d / name))  # fmt: skip
    return d


def chat_service(d: Path, url: str, policy: str = "pol", server: dict | None = None, **values):
    """``ccpo serve``'s app (a :class:`~tests.helpers.serve.LiveServer`, not started) with the
    policy ``d / policy`` of :func:`trained_chat_policies` against the endpoint at ``url``."""
    from ccpo.runtime.config import load_deploy_config
    from ccpo.runtime.server import Service
    from tests.helpers.serve import STORE, LiveServer

    cfg = {
        "endpoints": {"*": {"url": url}},
        "prices": [str(d / "prices.json")],
        "timeout": 15.0,
        "backoff_base": 0.005,
        "server": {"state": STORE.default(), **(server or {})},
        **values,
    }
    return LiveServer(Service.from_artifact(d / policy, load_deploy_config(None, cfg)))
