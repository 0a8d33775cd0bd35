"""What goes over the wire to an OpenAI-compatible endpoint, and what comes back.

- :class:`Endpoint`: a model at a ``base_url`` and where its API key comes from
  (:meth:`Endpoint.resolve_key`: the OpenAI key is never sent to another host unless named);
  :class:`EndpointError`: a setting of an endpoint that its owner must fix.
- :class:`ChatRequest` (everything that goes into the cache key), written as the OpenAI API
  takes it by :func:`_request_body`; :class:`ChatResult` and :class:`TokenLogprob`, read from
  a reply by :func:`_parse_completion` (:class:`_Malformed` for anything unusable; usage the
  endpoint does not report counts at its worst case, :func:`prompt_token_bound` and
  ``max_tokens``, and is flagged ``usage_estimated``).
- JSON is written and read by ``orjson`` when it is installed (the ``serve`` extra), else by
  the standard library (:func:`reply_json`), with the same values either way.
- URLs: :func:`chat_url`, :func:`redact_url` (a password shown as ``***``),
  :func:`host_port`, :func:`without_userinfo`, :func:`is_openai_api`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ccpo.errors import CCPOError

try:  # the serve extra: the faster parser and writer
    import orjson as _orjson
except ImportError:  # pragma: no cover - the core install
    _orjson = None  # type: ignore[assignment]


DUMMY_API_KEY = "sk-no-key-required"


class EndpointError(CCPOError):
    """An endpoint's setting the deployment's owner must fix, the same for every request: its
    key (missing, refused: HTTP 401/403), its model name or its URL (HTTP 404). Not a failure
    of one call (:class:`~ccpo.llm.http_errors.LLMCallError`), nor of the policy."""


OPENAI_HOST = "api.openai.com"
OPENAI_URL = f"https://{OPENAI_HOST}/v1"


@functools.lru_cache(maxsize=256)  # asked on every call (its key, its headers)
def is_openai_api(base_url: str | None) -> bool:
    """True iff ``base_url`` is the OpenAI API itself: no URL (the SDK's default), or an
    ``https`` URL whose parsed host is exactly ``api.openai.com`` (not a path or a longer host
    that merely contains it)."""
    if base_url is None:
        return True
    try:
        parts = urlsplit(base_url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return False
    return parts.scheme == "https" and host == OPENAI_HOST


@dataclass(frozen=True)
class Endpoint:
    """A model served at an OpenAI-compatible URL.

    ``api_key_env`` names the environment variable holding the key; ``api_key`` is a key read
    from a config file. With neither, the OpenAI API (no ``base_url``) gets ``OPENAI_API_KEY``
    and any other endpoint a dummy key (local servers ignore it): the OpenAI key is never sent
    to another host unless ``api_key_env`` says so.
    """

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False, compare=False)

    def resolve_key(self) -> str:
        if self.api_key:
            return self.api_key
        if self.api_key_env:
            val = os.environ.get(self.api_key_env)
            if not val:
                raise EndpointError(
                    f"model '{self.model}': environment variable {self.api_key_env} is not set "
                    "(it should hold the API key)"
                )
            return val
        if is_openai_api(self.base_url):
            return os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY
        # never send the OpenAI key to another host unless asked to (api_key_env)
        return DUMMY_API_KEY

    @property
    def where(self) -> str:
        return (
            f"'{self.model}' at {redact_url(self.base_url) if self.base_url else 'the OpenAI API'}"
        )


@dataclass
class ChatRequest:
    """One chat-completion request (everything that goes into the cache key)."""

    messages: list[dict[str, str]]
    temperature: float = 0.0
    max_tokens: int = 256
    stop: list[str] | None = None
    logprobs: bool = True
    top_logprobs: int = 5
    #: nucleus sampling as a client asked it (None: not sent, the endpoint's default)
    top_p: float | None = None
    #: whether ``max_tokens`` is sent; False: the model's own limit applies, and
    #: ``max_tokens`` is only the worst case budgets count (a chat step without a cap)
    cap: bool = True
    #: which ladder step sends it (``{"round": "2", "role": "guide"}``): sent as ``X-CCPO-*``
    #: headers, which a replay endpoint reads and real endpoints ignore; not part of the key
    step: dict[str, str] | None = None

    def headers(self) -> dict[str, str]:
        """The ``X-CCPO-Round`` / ``X-CCPO-Role`` headers of :attr:`step`."""
        return {f"X-CCPO-{k.capitalize()}": str(v) for k, v in (self.step or {}).items()}

    def flight_key(self, model: str, sample: int) -> tuple[Any, ...]:
        """What tells this request from another in flight: the fields of
        :meth:`key_fields` and ``sample``, as a tuple (hashed, not serialised)."""
        return (
            model,
            tuple((m["role"], m["content"], m.get("name")) for m in self.messages),
            float(self.temperature),
            int(self.max_tokens),
            tuple(self.stop) if self.stop else None,
            bool(self.logprobs),
            int(self.top_logprobs) if self.logprobs else 0,
            int(sample),
            self.top_p,
            self.cap,
        )

    def key_fields(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [_keyed(m) for m in self.messages],
            "temperature": float(self.temperature),
            "max_tokens": int(self.max_tokens),
            "stop": list(self.stop) if self.stop else None,
            "logprobs": bool(self.logprobs),
            "top_logprobs": int(self.top_logprobs) if self.logprobs else 0,
            # (only when they depart from the default: earlier keys stay as they were)
            **({} if self.top_p is None else {"top_p": float(self.top_p)}),
            **({} if self.cap else {"cap": False}),
        }


@dataclass(frozen=True)
class Sampling:
    """The sampling fields a client of ``ccpo serve`` sent with a chat completion
    (``max_tokens``, ``temperature``, ``top_p``, ``stop``; None: not given). A chat step's
    request takes them (:meth:`apply`): they reach the model whose reply is returned."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | None = None

    def apply(self, request: ChatRequest) -> ChatRequest:
        """``request`` with the fields given here in place of its own (a ``max_tokens``
        given is sent, as the cap and the worst case)."""
        changes: dict[str, Any] = {}
        if self.max_tokens is not None:
            changes.update(max_tokens=self.max_tokens, cap=True)
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        if self.top_p is not None:
            changes["top_p"] = self.top_p
        if self.stop:
            changes["stop"] = list(self.stop)
        return dataclasses.replace(request, **changes) if changes else request

    def departures(self, cap: int | None) -> list[str]:
        """The fields given that depart from how the ladder was calibrated (temperature 0,
        the endpoint's top_p, no stop sequence, ``cap`` output tokens: None, none): a
        ``max_tokens`` under the cap, any other temperature, a top_p under 1, a stop."""
        out = []
        if self.max_tokens is not None and (cap is None or self.max_tokens < cap):
            out.append("max_tokens")
        if self.temperature is not None and self.temperature != 0:
            out.append("temperature")
        if self.top_p is not None and self.top_p < 1:
            out.append("top_p")
        if self.stop:
            out.append("stop")
        return out


#: the client's sampling fields for the calls of the question being answered (None: none)
request_sampling: contextvars.ContextVar[Sampling | None] = contextvars.ContextVar(
    "request_sampling", default=None
)


@dataclass(frozen=True)
class ReplySink:
    """Where the content of a streamed reply goes as it arrives: ``put`` takes each piece.
    Only the call of ``step`` (``{"round", "role"}``) streams to it: the one whose reply the
    policy decided to return before it was sent (None: no call yet)."""

    put: Callable[[str], None]
    step: dict[str, str] | None = None

    def at(self, step: dict[str, str]) -> ReplySink:
        return ReplySink(self.put, step)


#: the sink of the question being answered, when its client reads the reply as it comes
reply_sink: contextvars.ContextVar[ReplySink | None] = contextvars.ContextVar(
    "reply_sink", default=None
)


class StreamedReply:
    """A streamed completion read line by line (server-sent events, :meth:`feed`): its
    content as it comes, then the completion it adds up to (:meth:`completion`, read as an
    unstreamed one)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish: str | None = None
        self.logprobs: list[Any] = []
        self.usage: Any = None
        self.extra: dict[str, Any] = {}
        self.done = False

    def feed(self, line: bytes) -> str | None:
        """One line of the stream; the content it adds (None: none)."""
        text = line.strip()
        if not text.startswith(b"data:"):
            return None
        data = text[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return None
        chunk = reply_json(data)
        if _get(chunk, "error") is not None:
            raise _Malformed("an error in the stream")
        for key in ("model", "ccpo_replay"):
            if _get(chunk, key) is not None:
                self.extra[key] = _get(chunk, key)
        if _get(chunk, "usage") is not None:
            self.usage = _get(chunk, "usage")
        choices = _get(chunk, "choices") or []
        if not choices:
            return None
        ch = choices[0]
        if _get(ch, "finish_reason"):
            self.finish = _get(ch, "finish_reason")
        lps = _get(_get(ch, "logprobs"), "content")
        if isinstance(lps, list):
            self.logprobs.extend(lps)
        piece = _get(_get(ch, "delta"), "content")
        if isinstance(piece, str) and piece:
            self.parts.append(piece)
            return piece
        return None

    def completion(self) -> dict[str, Any]:
        """The completion the stream adds up to, as an unstreamed reply's JSON has it."""
        message = {"role": "assistant", "content": "".join(self.parts)}
        choice = {"index": 0, "message": message, "finish_reason": self.finish,
                  "logprobs": {"content": self.logprobs} if self.logprobs else None}  # fmt: skip
        return {"choices": [choice], "usage": self.usage, **self.extra}


def _keyed(m: dict[str, str]) -> dict[str, str]:
    """A message as a cache key holds it: role and content, and a chat message's ``name``."""
    d = {"role": m["role"], "content": m["content"]}
    return d if "name" not in m else {**d, "name": m["name"]}


class TokenLogprob:
    """A token's log-prob and ``top``: of its alternatives (``top_logprobs``), those with a
    number, by token. A reply's alternatives are read when ``top`` is first asked for (by the
    response cache or a trace; a live round reads ``logprob`` only)."""

    __slots__ = ("_alts", "_top", "logprob", "token")

    def __init__(
        self,
        token: str,
        logprob: float,
        top: dict[str, float] | None = None,
        *,
        alts: Sequence[Any] = (),
    ) -> None:
        """``top``, or ``alts``: the reply's ``top_logprobs`` entries, read on demand."""
        self.token, self.logprob = token, logprob
        self._top, self._alts = top, alts

    @property
    def top(self) -> dict[str, float]:
        if self._top is None:
            self._top = _alternatives(self._alts)
            self._alts = ()
        return self._top

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenLogprob):
            return NotImplemented
        return (self.token, self.logprob, self.top) == (other.token, other.logprob, other.top)

    def __repr__(self) -> str:
        return f"TokenLogprob(token={self.token!r}, logprob={self.logprob!r}, top={self.top!r})"


@dataclass
class ChatResult:
    """A normalised completion: text, usage, per-token log-probs (or None)."""

    text: str
    input_tokens: int
    output_tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    usage_estimated: bool = False  # not reported: the tokens are the request's worst case
    cached: bool = False
    cost_usd: float = 0.0
    #: a replay endpoint's recorded parse of this reply (``ccpo_replay``: answer, verdict,
    #: signals), taken as recorded rather than parsed again; None from a real endpoint
    recorded: dict[str, Any] | None = None
    model: str | None = None  # the model that answered, as the response names it (not cached)

    def to_cache(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "text": self.text,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "logprobs": None
            if self.logprobs is None
            else [[t.token, t.logprob, t.top] for t in self.logprobs],
            "finish_reason": self.finish_reason,
            "usage_estimated": self.usage_estimated,
        }

    @classmethod
    def from_cache(cls, d: dict[str, Any]) -> ChatResult:
        lps = d.get("logprobs")
        return cls(
            text=d["text"],
            input_tokens=int(d["input_tokens"]),
            output_tokens=int(d["output_tokens"]),
            logprobs=None
            if lps is None
            else [TokenLogprob(t, float(lp), dict(top or {})) for t, lp, top in lps],
            finish_reason=d.get("finish_reason"),
            usage_estimated=bool(d.get("usage_estimated", False)),
            cached=True,
            recorded=d.get("recorded"),
        )


class _Malformed(Exception):
    pass


def without_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


def chat_url(base_url: str | None) -> str:
    """Where a chat completion is POSTed: ``{base_url}/chat/completions``; without a base URL,
    ``$OPENAI_BASE_URL`` or the OpenAI API (as the ``openai`` SDK does)."""
    base = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
    return base.rstrip("/") + "/chat/completions"


def redact_url(url: str) -> str:
    """``url`` as it may be printed or logged: a password in its user info replaced by
    ``***`` (``http://user:***@host/v1``); any other URL unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("@")[-1] if "@" in url else url  # unparseable: drop any user info
    if not password:
        return url
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}"))


def host_port(base_url: str | None) -> str:
    """``host:port`` of an endpoint URL (the OpenAI API's without one), never its path, query
    or user info (where a key could hide)."""
    u = urlsplit(base_url or f"https://{OPENAI_HOST}/v1")
    try:
        port = u.port
    except ValueError:
        port = None
    port = port or (443 if u.scheme == "https" else 80)
    host = u.hostname or "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for the response's JSON (dicts), None when absent or not a dict."""
    return obj.get(key) if isinstance(obj, dict) else None


def _token_logprobs(content: list[Any]) -> list[TokenLogprob] | None:
    """The tokens' log-probs of a choice's ``logprobs.content`` (None when a token has none,
    or not a number); their alternatives are read when asked for (:func:`_alternatives`).
    Written out rather than through :func:`_get`: a reply carries (1 + top_logprobs) entries
    per token."""
    lps = []
    append = lps.append
    for tok in content:
        if not isinstance(tok, dict):
            return None
        lp = tok.get("logprob")
        if not isinstance(lp, int | float) or lp != lp:  # absent, not a number, NaN
            return None
        alts = tok.get("top_logprobs")
        append(TokenLogprob(str(tok.get("token")), float(lp), alts=alts or ()))
    return lps


def _alternatives(alts: Any) -> dict[str, float]:
    """A token's ``top_logprobs`` entries, those with a number, by token (else {})."""
    top: dict[str, float] = {}
    if isinstance(alts, list | tuple):
        for alt in alts:
            if isinstance(alt, dict):
                v = alt.get("logprob")
                if isinstance(v, int | float):
                    top[str(alt.get("token"))] = float(v)
    return top


def reply_json(raw: bytes) -> Any:
    """A reply body's JSON: ``orjson`` when installed, else (and for what it refuses that the
    standard library reads: NaN, Infinity) :func:`json.loads`. (orjson reads an integer past
    64 bits as a float: a token count that large is then no count, the usage is estimated.)"""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def prompt_token_bound(messages: list[dict[str, Any]]) -> int:
    """An upper bound of a prompt's tokens: a token of a byte-level BPE tokenizer covers at
    least one byte, so the UTF-8 bytes of every text field of every message the endpoint
    renders into the prompt (its role, content and ``name``: all are billed), plus a chat
    template's few tokens per message (8) and per request (16)."""
    n = 16
    for m in messages:
        n += 8
        for v in m.values():
            if isinstance(v, str):
                n += len(v.encode("utf-8"))
    return n


def _parse_completion(resp: Any, request: ChatRequest) -> ChatResult:
    """Turn a chat-completion response body (JSON as dicts) into a ChatResult; raise
    ``_Malformed`` for anything unusable."""
    choices = _get(resp, "choices")
    if not choices or not isinstance(choices, list):
        raise _Malformed("response has no choices")
    ch = choices[0]
    text = _get(_get(ch, "message"), "content")
    if not isinstance(text, str):
        raise _Malformed("response has no message content")
    lps: list[TokenLogprob] | None = None
    content = _get(_get(ch, "logprobs"), "content")
    if content and isinstance(content, list):
        lps = _token_logprobs(content)
    usage = _get(resp, "usage")
    n_in, n_out = _get(usage, "prompt_tokens"), _get(usage, "completion_tokens")
    estimated = not isinstance(n_in, int) or not isinstance(n_out, int)
    if not isinstance(n_in, int):  # what is not reported counts at its worst case: the most
        n_in = prompt_token_bound(request.messages)  # the endpoint could have billed
    if not isinstance(n_out, int):
        n_out = int(request.max_tokens)
    recorded = _get(resp, "ccpo_replay")
    return ChatResult(
        text=text,
        input_tokens=n_in,
        output_tokens=n_out,
        logprobs=lps,
        finish_reason=_get(ch, "finish_reason"),
        usage_estimated=estimated,
        recorded=recorded if isinstance(recorded, dict) else None,
        model=_get(resp, "model") if isinstance(_get(resp, "model"), str) else None,
    )


def _request_body(model: str, request: ChatRequest, want_lp: bool, stream: bool = False) -> bytes:
    """The JSON body of a chat-completion request, as the OpenAI API takes it (``stream``:
    streamed, its usage in the last chunk)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "temperature": request.temperature,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if request.cap:
        body["max_tokens"] = request.max_tokens
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stop:
        body["stop"] = request.stop
    if want_lp:
        body["logprobs"] = True
        if request.top_logprobs:
            body["top_logprobs"] = request.top_logprobs
    # orjson when it can (it writes NaN as null: json's NaN goes out as it did; what orjson
    # refuses, json says why)
    if _orjson is not None and math.isfinite(request.temperature):
        try:
            return _orjson.dumps(body)
        except _orjson.JSONEncodeError:
            pass
    return json.dumps(body, ensure_ascii=False).encode("utf-8")
