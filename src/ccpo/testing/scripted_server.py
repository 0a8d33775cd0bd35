"""A small scripted OpenAI-compatible HTTP server on 127.0.0.1, for tests and benchmarks.

It answers ``POST /v1/chat/completions`` (and ``GET /v1/models``) over real HTTP, so the real
``openai`` client, retries, timeouts and the cache are exercised end to end — nothing is mocked.
:class:`ScriptedServer` holds the script (regex rules → replies, and a fallback) and, as its
fields say, injects latency, failures (HTTP errors, time-outs, garbage), log-prob behaviours
and auth; it counts what it received and what it billed.

Usage::

    with ScriptedServer(rules=[(r"Evaluate the answer", "Yes")], fallback="Answer: B") as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="x")
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = str | Callable[[dict[str, Any]], str]

_TOKEN = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    """Split a reply into pseudo-tokens (a word with its leading white space)."""
    return _TOKEN.findall(text) or [""]


def default_token_logprob(token: str) -> float:
    h = int(hashlib.sha256(token.encode()).hexdigest()[:8], 16)
    return -0.01 - (h % 1000) / 1000 * 1.49


def prompt_text(request: dict[str, Any], last_only: bool = False) -> str:
    msgs = request.get("messages") or []
    if last_only and msgs:
        msgs = msgs[-1:]
    parts = []
    for m in msgs:
        c = m.get("content")
        if isinstance(c, list):
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(str(c or ""))
    return "\n".join(parts)


@dataclass
class ScriptedServer:
    """A threaded OpenAI-compatible chat-completions server with scripted replies.

    - **Scripted replies**: a list of ``(pattern, reply)`` rules. The first rule whose regex
      matches the request's prompt text (all message contents joined by newlines, or only the
      last message with ``match_last=True``) wins. ``reply`` is a string or a callable
      ``reply(request: dict) -> str``. A fallback reply (or callable) answers everything else.
    - **Stop sequences** are honoured (the reply is cut at the first one), like a real server.
    - **Latency**: ``latency`` seconds per successful reply (``time.sleep`` in the handler
      thread).
    - **Generation time**: ``first_token_latency`` seconds before the first token, then
      ``token_latency`` seconds a token (the reply as ``max_tokens`` leaves it).
    - **Streaming**: ``stream: true`` is answered as server-sent events, one token a chunk as
      it is written (with its log-prob when asked), the ``finish_reason`` in the last, the
      usage in one more with ``stream_options.include_usage``, then ``[DONE]``; with ``hold``
      (an event) set, a stream waits after its first token until it is set.
    - **Failure injection**: with probability ``failure_rate`` (seeded ``random.Random(seed)``)
      a request fails with one of ``failure_kinds``: ``"429"``, ``"500"`` (any HTTP status given
      as digits), ``"timeout"`` (sleeps ``timeout_sleep`` seconds, then closes the connection
      without replying), ``"garbage"`` (HTTP 200 with a body that is not a chat completion).
      ``failure_headers`` are added to every injected HTTP error (e.g.
      ``{"retry-after-ms": "300"}``), ``failure_body`` is its JSON body.
    - **Log-probs**: ``logprobs_mode`` ``"ok"`` returns per-token log-probs (with
      ``top_logprobs`` alternatives) when requested; ``"ignore"`` silently omits them;
      ``"reject"`` answers HTTP 400 to any request that asks for them, ``"reject500"`` answers
      HTTP 500 saying so (as llama_cpp.server without ``--logits_all`` does). Per-token
      log-probs come from ``token_logprob(token)`` (default: a deterministic value in
      [-1.5, -0.01] from a hash of the token).
    - **Auth**: with ``api_key`` set, requests without ``Authorization: Bearer <api_key>`` get
      401.
    - **Usage**: ``usage=False`` leaves ``usage`` out of every reply (the bill is kept all the
      same); ``prompt_tokens(text)`` is how many tokens the server bills for a prompt's text
      (default: its pseudo-tokens, a word with its leading white space); ``bill_prompt(req)``,
      when set, bills the whole request instead (a message's ``name`` too).
    - **Embeddings**: with ``embed`` (a function text → vector) set, ``POST /v1/embeddings``
      answers OpenAI's embeddings shape after ``embed_latency`` seconds (``n_embeddings``
      counts them); without it, 404 as an endpoint without embeddings.
    - **Counters**: ``n_requests`` (every request received), ``n_completions`` (successful
      replies), ``n_failures``, and ``requests`` (the parsed JSON bodies, in arrival order).
    """

    rules: Sequence[tuple[str, Reply]] = ()
    fallback: Reply = "OK"
    latency: float = 0.0
    failure_rate: float = 0.0
    failure_kinds: Sequence[str] = ("429", "500", "timeout", "garbage")
    timeout_sleep: float = 1.0
    seed: int = 0
    failure_headers: dict[str, str] = field(default_factory=dict)
    #: the JSON body of injected HTTP errors (default ``{"error": {"message": "error <status>"}}``)
    failure_body: dict[str, Any] | None = None
    logprobs_mode: str = "ok"
    match_last: bool = False
    api_key: str | None = None
    token_logprob: Callable[[str], float] = default_token_logprob
    usage: bool = True
    prompt_tokens: Callable[[str], int] | None = None
    #: how many prompt tokens the server bills for a whole request (its parsed body: every
    #: field of its messages); when set, it replaces ``prompt_tokens``
    bill_prompt: Callable[[dict[str, Any]], int] | None = None
    n_requests: int = 0
    n_completions: int = 0
    n_failures: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: tokens billed per model, [input, output], counted when a completion is made (as an
    #: endpoint bills it, whether or not the client is still there to read it); GET
    #: ``/ccpo-billing`` returns it
    billed: dict[str, list[int]] = field(default_factory=dict)
    embed: Callable[[str], list[float]] | None = None
    embed_latency: float = 0.0
    n_embeddings: int = 0
    first_token_latency: float = 0.0
    token_latency: float = 0.0
    #: set: a streamed reply waits after its first token until it is (10 s at most)
    hold: threading.Event | None = None

    def __post_init__(self) -> None:
        if self.logprobs_mode not in ("ok", "ignore", "reject", "reject500"):
            raise ValueError("logprobs_mode must be 'ok', 'ignore', 'reject' or 'reject500'")
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._compiled = [(re.compile(p, re.S), r) for p, r in self.rules]
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.failure_log: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The base URL to give an OpenAI client (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # one buffered write per response and no Nagle: avoids delayed-ACK stalls
            wbufsize = 1 << 16
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:  # silence
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/ccpo-billing"):
                    with server._lock:
                        self._send(200, {m: list(v) for m, v in server.billed.items()})
                elif self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": []})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.rstrip("/").endswith("/embeddings") and server.embed is not None:
                    server._embeddings(self, json.loads(raw or b"{}"))
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                try:
                    req = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "invalid JSON"}})
                    return
                server._handle(self, req)

            def _send(
                self, status: int, obj: Any, raw: bytes | None = None, headers: Any = None
            ) -> None:
                body = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()

            def _stream(self, events: Any) -> None:
                """Server-sent events, each written (chunked) as it is made."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for e in events:
                    data = (e if isinstance(e, str) else f"data: {json.dumps(e)}\n\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default 5 resets bursts of concurrent connects

            def handle_error(self, request: Any, client_address: Any) -> None:
                # a client that went away (a killed replica) is not the world's error
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # shutdown() waits for the loop's next poll: every 50 ms, not the default 0.5 s
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset_counters(self) -> None:
        with self._lock:
            self.n_requests = self.n_completions = self.n_failures = 0
            self.requests.clear()
            self.billed.clear()
            self.failure_log.clear()

    # ------------------------------------------------------------------ replies
    def _embeddings(self, h: Any, req: dict[str, Any]) -> None:
        assert self.embed is not None
        texts = req.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        with self._lock:
            self.n_embeddings += 1
        if self.embed_latency:
            time.sleep(self.embed_latency)
        data = [
            {"object": "embedding", "index": i, "embedding": self.embed(t)}
            for i, t in enumerate(texts)
        ]
        n = sum(len(tokenize(t)) for t in texts)
        h._send(200, {"object": "list", "data": data, "model": req.get("model"),
                      "usage": {"prompt_tokens": n, "total_tokens": n}})  # fmt: skip

    def reply_for(self, req: dict[str, Any]) -> str:
        text = prompt_text(req, last_only=self.match_last)
        for pat, reply in self._compiled:
            if pat.search(text):
                return reply(req) if callable(reply) else reply
        return self.fallback(req) if callable(self.fallback) else self.fallback

    def _handle(self, h: Any, req: dict[str, Any]) -> None:
        with self._lock:
            self.n_requests += 1
            self.requests.append(req)
            fail = self.failure_rate > 0 and self._rng.random() < self.failure_rate
            kind = self._rng.choice(list(self.failure_kinds)) if fail else None
            if kind:
                self.n_failures += 1
                self.failure_log.append(kind)
        if self.api_key is not None:
            auth = h.headers.get("Authorization", "")
            if auth != f"Bearer {self.api_key}":
                h._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
                return
        if kind == "429":
            body = {"error": {"message": "rate limited", "type": "rate_limit"}}
            h._send(429, body, headers=self.failure_headers)
            return
        if kind is not None and kind.isdigit():
            body = self.failure_body or {"error": {"message": f"error {kind}"}}
            h._send(int(kind), body, headers=self.failure_headers)
            return
        if kind == "timeout":
            time.sleep(self.timeout_sleep)
            h.close_connection = True
            return
        if kind == "garbage":
            h._send(200, None, raw=b'{"id": "x", "object": "chat.completion", "choices": [{"gar')
            return
        wants_lp = bool(req.get("logprobs"))
        if wants_lp and self.logprobs_mode.startswith("reject"):
            code = 500 if self.logprobs_mode == "reject500" else 400
            msg = "logprobs is not supported for models created with logits_all=False"
            h._send(code, {"error": {"message": msg, "type": "error", "param": "logprobs"}})
            return
        text = self.reply_for(req)
        finish = "stop"
        for s in req.get("stop") or []:
            if s and s in text:
                text = text[: text.index(s)]
        toks = tokenize(text)
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        if max_tokens and len(toks) > int(max_tokens):
            toks = toks[: int(max_tokens)]
            text = "".join(toks)
            finish = "length"
        if self.latency:
            time.sleep(self.latency)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        if wants_lp and self.logprobs_mode == "ok":
            k = int(req.get("top_logprobs") or 0)
            content = []
            for t in toks:
                lp = float(self.token_logprob(t))
                top = [{"token": t, "logprob": lp, "bytes": None}]
                for j in range(1, k):
                    top.append(
                        {"token": f"{t.strip()}~{j}", "logprob": lp - 2.0 * j, "bytes": None}
                    )
                content.append({"token": t, "logprob": lp, "bytes": None, "top_logprobs": top})
            choice["logprobs"] = {"content": content}
        prompt = prompt_text(req)
        if self.bill_prompt is not None:
            n_in = self.bill_prompt(req)
        else:
            n_in = self.prompt_tokens(prompt) if self.prompt_tokens else len(tokenize(prompt))
        body = {
            "id": f"chatcmpl-{self.n_requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model", "scripted"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_in,
                "completion_tokens": len(toks),
                "total_tokens": n_in + len(toks),
            },
        }
        if not self.usage:
            del body["usage"]
        with self._lock:
            self.n_completions += 1
            b = self.billed.setdefault(str(req.get("model", "scripted")), [0, 0])
            b[0] += n_in
            b[1] += len(toks)
        if self.first_token_latency:
            time.sleep(self.first_token_latency)
        if req.get("stream"):
            h._stream(self._events(req, body, toks))
            return
        if self.token_latency:
            time.sleep(self.token_latency * max(0, len(toks) - 1))
        h._send(200, body)

    def _events(self, req: dict[str, Any], body: dict[str, Any], toks: list[str]) -> Any:
        """The completion ``body`` as the chunks of a stream, one token each, as written."""
        head = {k: body[k] for k in ("id", "created", "model")}
        choice = body["choices"][0]
        lps = (choice.get("logprobs") or {}).get("content")

        def chunk(delta: dict[str, Any], **more: Any) -> dict[str, Any]:
            c = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None, **more}
            return {**head, "object": "chat.completion.chunk", "choices": [c]}

        yield chunk({"role": "assistant", "content": ""})
        for j, t in enumerate(toks if choice["message"]["content"] else []):
            if j and self.token_latency:
                time.sleep(self.token_latency)
            if j == 1 and self.hold is not None:
                self.hold.wait(10)
            yield chunk({"content": t}, logprobs={"content": [lps[j]]} if lps else None)
        yield chunk({}, finish_reason=choice["finish_reason"])
        if (req.get("stream_options") or {}).get("include_usage") and "usage" in body:
            yield {**head, "object": "chat.completion.chunk", "choices": [],
                   "usage": body["usage"]}  # fmt: skip
        yield "data: [DONE]\n\n"
