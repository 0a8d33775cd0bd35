"""HTTP status to error: what a failed attempt means, and whether a retry can help.

- :func:`status_error` maps every HTTP error status in one place: 401/403 are the key's to fix
  (:func:`auth_error`, naming where the key came from: :func:`key_source`), 404 the model's or
  the URL's, any other 4xx but 408/409/429 this request's only (:func:`refused_error`), and
  log-probs refused (:class:`_LogprobsRefused`); 408/409/429 and 5xx are retried, after the
  wait the server asks for (:func:`parse_retry_after`: ``Retry-After``, ``retry-after-ms``).
- :func:`transport_error`: a failure below HTTP in a few words (refused, time-out, other).
- :class:`LLMCallError`: a call failed for good (``unsure``: it may have been billed);
  :class:`NotRecorded`: a replay endpoint (``ccpo replay-server``) holds no reply to the
  question; :class:`~ccpo.llm.wire.EndpointError`: the key, model or URL is the owner's to fix.
- An upstream error's text never reaches a message or a log (providers echo the key they
  were sent, partly masked): only its identifiers do (:func:`error_codes`).
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from typing import Any

from ccpo.errors import CCPOError
from ccpo.llm.wire import Endpoint, EndpointError, host_port, is_openai_api


class LLMCallError(CCPOError):
    """A call failed for good (retries exhausted, or a request the endpoint refuses).
    ``unsure``: its last attempt may have been billed (no reply read; counted at its worst
    case)."""

    unsure: bool = False


#: the error code of a replay endpoint's 404 for a question (or conversation) its trace file
#: does not hold (:mod:`ccpo.runtime.replay_server`)
NOT_RECORDED = "not_recorded"


class NotRecorded(LLMCallError):
    """A replay endpoint (``ccpo replay-server``) has no recorded reply to this question or
    conversation: this request fails, the next one may be recorded; the model and the URL are
    right."""


class _LogprobsRefused(Exception):
    """The endpoint refused a request because it asked for log-probs."""


def _causes(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and all(x is not c for c in chain):
        chain.append(x)
        x = x.__cause__ or x.__context__
    return chain


def transport_error(
    e: BaseException, endpoint: Endpoint, timeouts: tuple[type[BaseException], ...]
) -> str:
    """What went wrong below HTTP, in a few words: "connection refused by host:port" when
    nothing listens there, "timeout" for a real one (``timeouts``: the transport's time-out
    exceptions), else "connection error"."""
    chain = _causes(e)
    if any(isinstance(x, ConnectionRefusedError) for x in chain):
        return f"connection refused by {host_port(endpoint.base_url)}"
    # an OSError below a time-out (a DNS failure, a reset) is no time-out
    other = any(isinstance(x, OSError) and not isinstance(x, TimeoutError) for x in chain)
    if any(isinstance(x, timeouts) for x in chain) and not other:
        return "timeout"
    return f"connection error ({host_port(endpoint.base_url)})"


def _error_body(raw: bytes) -> tuple[str, Any]:
    """An error reply's text and its JSON body (None when it is not JSON)."""
    text = raw.decode("utf-8", "replace")
    try:
        return text, json.loads(text)
    except ValueError:
        return text, None


#: what an upstream error body may show of itself: identifiers (``context_length_exceeded``,
#: ``model_not_found``, ``max_tokens``), never free text, which may echo a key (masked or not)
_SAFE_WORD = re.compile(r"[a-z_]{1,64}")


def error_codes(body: Any) -> list[str]:
    """The ``code``, ``type`` and ``param`` of an OpenAI-style error body (``{"error": {...}}``)
    that are plain identifiers (lower-case letters and ``_``): the part of an upstream error
    that may reach a client or a log. Its ``message`` never does: providers echo the key they
    were sent in it, partly masked (``sk-sec********3456``)."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return []
    found = [inner.get(k) for k in ("code", "type", "param")]
    return list(dict.fromkeys(v for v in found if isinstance(v, str) and _SAFE_WORD.fullmatch(v)))


def key_source(endpoint: Endpoint) -> str:
    """Where the key sent to ``endpoint`` came from, as its owner would fix it."""
    if endpoint.api_key:
        return f"the api_key given for '{endpoint.model}' in the config file"
    if endpoint.api_key_env:
        return f"${endpoint.api_key_env}"
    if is_openai_api(endpoint.base_url):
        return "$OPENAI_API_KEY"
    return (
        f"the config: no key is sent to this host unless named (endpoints: {{{endpoint.model}: "
        "{url: ..., key_env: VAR}})"
    )


def auth_error(endpoint: Endpoint, status: int) -> EndpointError:
    """An HTTP 401/403: the key is the user's to fix (named by where it came from)."""
    return EndpointError(
        f"{endpoint.where}: authentication failed (HTTP {status}); check the API key in "
        f"{key_source(endpoint)}"
    )


def refused_error(endpoint: Endpoint, status: int, body: Any) -> CCPOError:
    """An HTTP 4xx that retrying cannot help (404: an :class:`EndpointError`, the model or URL
    is the user's to fix, unless a replay endpoint says the question is not recorded,
    :class:`NotRecorded`; another: an :class:`LLMCallError` for this request only), with the
    body's identifiers (:func:`error_codes`) and never its text."""
    codes = error_codes(body)
    said = f": {', '.join(codes)}" if codes else ""
    if status == 404 and NOT_RECORDED in codes:
        return NotRecorded(
            f"{endpoint.where}: the question is not in the recorded traces it replays (HTTP "
            f"404{said}): a replay endpoint answers only the questions of its trace file"
        )
    if status == 404:
        return EndpointError(
            f"{endpoint.where}: not found (HTTP 404{said}); check the model name and the base "
            "URL (it usually ends in /v1)"
        )
    return LLMCallError(
        f"{endpoint.where}: request refused (HTTP {status}{said}; the endpoint's message is "
        "not shown, it may echo the API key)"
    )


def status_error(
    endpoint: Endpoint,
    status: int,
    headers: Any,
    raw: bytes,
    want_lp: bool,
) -> tuple[str, float | None]:
    """Map an HTTP error reply: raise when retrying cannot help (401/403: the key,
    :func:`auth_error`; 404: the model or URL, another 4xx but 408/409/429: this request only,
    :func:`refused_error`; log-probs refused: :class:`_LogprobsRefused`), else return (what went
    wrong, seconds the server asked to wait) for a retry. No message shows the body's text."""
    text, body = _error_body(raw)
    if status in (401, 403):
        raise auth_error(endpoint, status)
    # log-probs refused: an HTTP 400 or 5xx whose body names them (llama_cpp.server started
    # without --logits_all answers 500 "logprobs is not supported ..."); any other 400 (a
    # context-length error, say) is this request's problem only
    if want_lp and (status == 400 or status >= 500) and "logprob" in text.lower():
        raise _LogprobsRefused
    if status not in (408, 409, 429) and status < 500:
        raise refused_error(endpoint, status, body)
    return f"HTTP {status}", parse_retry_after(headers)


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a response's headers: ``retry-after-ms`` (OpenAI's), else
    ``Retry-After`` as seconds or as an HTTP date; None when absent or unreadable."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            v = float(ms) / 1000.0
            return v if math.isfinite(v) and v >= 0 else None
        ra = headers.get("retry-after")
    except (AttributeError, ValueError, TypeError):
        return None
    if ra is None:
        return None
    try:
        v = float(ra)
        return v if math.isfinite(v) and v >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))
