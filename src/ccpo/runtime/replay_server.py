"""``ccpo replay-server``: an OpenAI-compatible endpoint that answers every model of a trace
file from its recorded outputs, so a deployment can be dry-run against your own logs at zero
API cost (and tests run the real HTTP path without inventing answers).

- :class:`ReplayIndex` (:func:`recorded_steps`, :class:`Recorded`): the file's steps by
  question, model, round and role. A call is matched by the question text its prompt holds
  (a ``chat`` trace's: by its whole conversation, :meth:`ReplayIndex.find_conversation`), its
  ``model`` and the ``X-CCPO-Round`` / ``X-CCPO-Role`` headers.
- :func:`create_replay_app`: the app. The reply is the recorded answer with its usage, plus
  ``ccpo_replay`` (the recorded step, which ccpo's agent takes as recorded), so live answers
  equal the policy's replay exactly (a round's recorded ``signals`` ride along with each of
  its steps). Anything not in the file gets HTTP 404 saying which (a question or
  conversation it does not hold: code ``not_recorded``, which ccpo's client reports as
  such, never as a wrong model or URL). A request's
  ``max_tokens`` under the recorded reply's length cuts it (in proportion), with
  ``finish_reason: length`` and the cap as its usage: as an endpoint that honours it.
  ``stream: true`` gets the reply as server-sent events (the content in one chunk).

Needs the serve extra (``pip install 'ccpo[serve]'``). Contract: docs/deploy.md, section "Dry
run against your own logs: `ccpo replay-server`".
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ccpo.errors import CCPOError
from ccpo.llm.http_errors import NOT_RECORDED

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
except ImportError as e:  # pragma: no cover - only without the extra
    raise CCPOError("ccpo replay-server needs the serve extra: pip install 'ccpo[serve]'") from e

from ccpo.runtime.rails import BodyLimit, error_response
from ccpo.traces.answers import family_of
from ccpo.traces.conversation import (
    ConversationError,
    conversation_key,
    conversation_of,
    request_text,
)
from ccpo.traces.io import iter_traces, loads_strict
from ccpo.traces.ladder import ladder_of_trace
from ccpo.traces.schema import Trace

_CONVERSATION = "\x00conversation:"  # a recorded conversation's key: never in a prompt's text
#: where ccpo's prompts put the question: (prefix, what ends it)
_QUESTION_MARKS = (
    ("Question: ", ("\nThought ", "\n\nBase answer:")),
    ("Q: ", ("\nA: ",)),
    ("Request:\n", ("\n\nReply:\n",)),  # the free-text verdict prompt (a verify step's)
)


class Miss(NamedTuple):
    """A request the file has no step for: the HTTP status and message of the refusal, and
    its error code (:data:`~ccpo.llm.http_errors.NOT_RECORDED`: the question is not in the
    file at all, which ccpo's client reports as such; None: not for that model or step)."""

    status: int
    message: str
    code: str | None = None


@dataclass(frozen=True)
class Recorded:
    """One recorded step: what a model said in one round of one question."""

    trace_id: str
    round: int
    role: str
    model: str
    answer: str
    text: str
    input_tokens: int
    output_tokens: int
    extra: dict[str, Any]


def _step_text(role: str, step: Any, verdict_mode: str, chat: bool = False) -> str:
    """A reply a reader can parse: the base's ``Answer: …``; a judging guide's raw reply (else
    ``Yes`` / ``No [answer]``); a verifier's ``Yes`` / ``No``; an agreeing guide's
    ``Answer: …``; a chat step's reply as it was recorded."""
    if role == "guide" and verdict_mode == "verify":
        return {"yes": "Yes", "no": "No"}.get(step.verdict or "", "")
    if chat:
        return step.answer
    if role == "guide" and verdict_mode == "judge":
        raw = getattr(step, "raw", None) or (step.model_extra or {}).get("raw")
        if isinstance(raw, str) and raw:
            return raw
        return "Yes" if step.verdict == "yes" else f"No [{step.answer}]"
    reasoning = (getattr(step, "reasoning", "") or "").strip()
    return f"{reasoning}\nAnswer: {step.answer}" if reasoning else f"Answer: {step.answer}"


def recorded_steps(tr: Trace) -> Iterable[Recorded]:
    """Every step of a trace as a :class:`Recorded` reply. A step stored as a repeat of an
    earlier call is asked only when that call was skipped (a routed question): it is billed
    at the original call's usage, as the replay prices it (:mod:`ccpo.traces.routing`)."""
    chat = family_of(tr.task, tr.family) == "chat"
    ladder = ladder_of_trace(tr)
    for r in tr.rounds:
        mode = r.verdict_mode or "judge"
        for role in ("base", "guide"):
            s = getattr(r, role)
            src = ladder.reused(r.round, role) if getattr(s, "reused", False) else None
            usage = s.usage if src is None else getattr(tr.rounds[src[0] - 1], src[1]).usage
            extra: dict[str, Any] = {"answer": s.answer}
            if role == "base":
                extra.update(logprob_mean=s.logprob_mean, logprob_min=s.logprob_min)
            else:
                extra.update(verdict=s.verdict, uncertainty=s.uncertainty)
            if r.signals is not None:  # the round's signals, taken as recorded
                extra["signals"] = r.signals.model_dump(mode="json", exclude_none=True)
            yield Recorded(
                tr.id,
                r.round,
                role,
                s.model,
                s.answer,
                _step_text(role, s, mode, chat),
                usage.input_tokens,
                usage.output_tokens,
                extra,
            )


class ReplayIndex:
    """Recorded steps by (question text, model, round, role)."""

    def __init__(self, traces: Iterable[Trace], source: str = "traces") -> None:
        self.source = source
        self.steps: dict[tuple[str, str, int, str], Recorded] = {}
        self.by_question: dict[str, dict[str, list[Recorded]]] = {}
        self.models: set[str] = set()
        n = 0
        self.duplicates = 0  # question texts met again (the first record answers them)
        self.conversations: set[str] = set()
        #: a chat trace's whole conversation as one text (what a verify step's verifier is
        #: shown: :func:`~ccpo.traces.conversation.request_text`) → its key
        self.requests: dict[str, str] = {}
        #: (model, question text) → the recorded question embedding (``traces embed``)
        self.embeddings: dict[tuple[str, str], list[float]] = {}
        for tr in traces:
            if tr.question_embedding is not None:
                key = (tr.question_embedding.model, tr.question)
                self.embeddings.setdefault(key, tr.question_embedding.vector)
            q = tr.question.strip()
            if tr.messages is not None and family_of(tr.task, tr.family) == "chat":
                # a conversation is found by all of it, not by its last turn
                q = _CONVERSATION + conversation_key(tr.messages)
                self.conversations.add(q)
                self.requests.setdefault(request_text(tr.messages).strip(), q)
            self.duplicates += q in self.by_question
            models = self.by_question.setdefault(q, {})
            for rec in recorded_steps(tr):
                self.steps.setdefault((q, rec.model, rec.round, rec.role), rec)
                models.setdefault(rec.model, []).append(rec)
                self.models.add(rec.model)
            n += 1
        if not n:
            raise CCPOError(f"{source}: holds no traces")
        self.n_questions = len(self.by_question)
        # longest first: a question that is part of another never wins over it
        self._scan = sorted(
            (set(self.by_question) - self.conversations) | set(self.requests),
            key=len,
            reverse=True,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayIndex:
        return cls(iter_traces(path), str(path))

    def find_question(self, text: str) -> str | None:
        """The recorded question a prompt holds: after ``Question:`` or ``Q:``, else the
        longest recorded question the prompt contains."""
        for prefix, ends in _QUESTION_MARKS:
            i = text.rfind(prefix) if prefix.startswith("Question") else text.find(prefix)
            if i < 0:
                continue
            rest = text[i + len(prefix) :]
            cut = min((j for j in (rest.find(e) for e in ends) if j >= 0), default=len(rest))
            cand = rest[:cut].strip()
            if cand in self.by_question or cand in self.requests:
                return self.requests.get(cand, cand)
        found = next((q for q in self._scan if q in text), None)
        return self.requests.get(found, found) if found is not None else None

    def find_conversation(self, messages: list[Any]) -> str | None:
        """The recorded conversation a request's messages are: all of them, or all but a first
        system message (a chat step's own system prompt, sent in front)."""
        if not self.conversations:
            return None
        try:
            conv = conversation_of(messages)
        except ConversationError:
            return None
        keys = [conv.key()]
        if conv.roles[0] == "system":  # (the last message is the user's: one is left)
            keys.append(conversation_key(conv.messages[1:]))
        return next((q for k in keys if (q := _CONVERSATION + k) in self.conversations), None)

    def lookup(
        self,
        text: str,
        model: str,
        round_: int | None,
        role: str | None,
        messages: list[Any] | None = None,
    ) -> Recorded | Miss:
        """The recorded step of a request, or a :class:`Miss` saying why there is none."""
        q = self.find_conversation(messages or []) or self.find_question(text)
        if q is None:
            what = "conversation" if self.conversations else "question"
            why = (
                f"this {what} is not in the recorded traces of {self.source}: a replay "
                f"endpoint answers only the {what}s its trace file holds"
            )
            return Miss(404, why, NOT_RECORDED)
        models = self.by_question[q]
        if model not in models:
            return Miss(404, (
                f"model '{model}' has no recorded answer to this question in {self.source} "
                f"(recorded: {', '.join(sorted(models))})"
            ))  # fmt: skip
        if round_ is not None and role is not None:
            rec = self.steps.get((q, model, round_, role))
            if rec is None:
                return Miss(
                    404, f"model '{model}' is not the {role} of round {round_} in {self.source}"
                )
            return rec
        steps = models[model]
        if round_ is not None:
            steps = [s for s in steps if s.round == round_]
        if role is not None:
            steps = [s for s in steps if s.role == role]
        if not steps:
            return Miss(404, f"model '{model}' has no such step of this question in {self.source}")
        if len({(s.answer, s.input_tokens, s.output_tokens) for s in steps}) > 1:
            where = ", ".join(f"round {s.round} {s.role}" for s in steps)
            return Miss(400, (
                f"model '{model}' answers this question in several steps ({where}); send the "
                "X-CCPO-Round and X-CCPO-Role headers to choose one"
            ))  # fmt: skip
        return steps[0]


def _error(status: int, message: str, type_: str, code: str | None = None) -> JSONResponse:
    """The body every ccpo server refuses with, with an OpenAI-style ``code`` when given."""
    if code is None:
        return error_response(status, type_, message)
    return JSONResponse({"error": {"type": type_, "code": code, "message": message}}, status)


class _BadRequest(ValueError):
    """A request the replay endpoint cannot read (a 400 saying why)."""


def _prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's messages (string content, or text parts); :class:`_BadRequest`
    naming the field for anything else."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages: a non-empty list of messages is required")
    parts = []
    for i, m in enumerate(messages):
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):  # content parts
            for j, p in enumerate(c):
                if not isinstance(p, dict) or not isinstance(p.get("text"), str):
                    raise _BadRequest(
                        f'messages[{i}].content[{j}]: a text part {{"type": "text", '
                        '"text": "..."} is required'
                    )
                parts.append(p["text"])
        else:
            raise _BadRequest(f"messages[{i}]: an object with a string 'content' is required")
    return "\n".join(parts)


MAX_BODY_BYTES = 4 * 2**20
"""The largest request body the replay endpoint reads (a prompt of ccpo's is far smaller)."""


def _streamed(reply: dict[str, Any]) -> StreamingResponse:
    """``reply`` as a stream: its content in one chunk, then its ``finish_reason``, then its
    usage and recorded step (``ccpo_replay``), then ``[DONE]``."""
    head = {"id": reply["id"], "object": "chat.completion.chunk",
            "created": reply["created"], "model": reply["model"]}  # fmt: skip
    choice = reply["choices"][0]

    def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [
        chunk({"role": "assistant", "content": choice["message"]["content"]}),
        chunk({}, choice["finish_reason"]),
        {**head, "choices": [], "usage": reply["usage"], "ccpo_replay": reply["ccpo_replay"]},
    ]
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return StreamingResponse(iter(lines), media_type="text/event-stream")


def create_replay_app(index: ReplayIndex, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The replay endpoint's app (docs/deploy.md, "Dry run ..."): bodies over ``max_body_bytes``
    are refused (413) before they are read whole; a body that is not JSON (or nested too
    deeply) or not a chat request is a 400, every error in the JSON error body."""
    app = FastAPI(title="ccpo replay-server", description=__doc__)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    counter = itertools.count(1)
    stats = {"requests": 0, "answered": 0, "missing": 0}

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:  # JSON, even for a bug
        return _error(500, f"internal error ({type(e).__name__})", "server_error")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        stats["requests"] += 1
        try:
            body = loads_strict((await request.body()).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, NaN, nesting
            return _error(400, f"the body is not JSON ({e})", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "model: a model name is required", "invalid_request_error")
        try:
            prompt = _prompt_text(body)
        except _BadRequest as e:
            return _error(400, str(e), "invalid_request_error")
        h = request.headers
        try:
            round_ = int(h["x-ccpo-round"]) if "x-ccpo-round" in h else None
        except ValueError:
            return _error(400, "X-CCPO-Round: not an integer", "invalid_request_error")
        role = h.get("x-ccpo-role")
        if role is not None and role not in ("base", "guide"):
            return _error(400, "X-CCPO-Role: must be base or guide", "invalid_request_error")
        got = index.lookup(prompt, body["model"], round_, role, body["messages"])
        if isinstance(got, Miss):
            stats["missing"] += 1
            kind = "not_found" if got.status == 404 else "invalid_request_error"
            return _error(got.status, got.message, kind, got.code)
        stats["answered"] += 1
        text, n_out, finish, extra = got.text, got.output_tokens, "stop", got.extra
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
        if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < n_out:
            # cut as an endpoint cuts at the cap (the recorded tokens' bounds are unknown: the
            # text is cut in proportion), and said so
            text, n_out, finish = text[: len(text) * cap // n_out], cap, "length"
            if extra.get("answer") == got.text:
                extra = {**extra, "answer": text}
        reply = {
                "id": f"replay-{next(counter)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": got.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": finish,
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": got.input_tokens,
                    "completion_tokens": n_out,
                    "total_tokens": got.input_tokens + n_out,
                },
                "ccpo_replay": {
                    "trace_id": got.trace_id,
                    "round": got.round,
                    "role": got.role,
                    **extra,
                },
            }  # fmt: skip
        return _streamed(reply) if body.get("stream") else JSONResponse(reply)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        """The recorded question embeddings (``traces embed``) of the texts asked, by the
        model that made them; a text without one is a 404 (a router then falls back)."""
        try:
            body = loads_strict((await request.body()).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not JSON ({e})", "invalid_request_error")
        texts = body.get("input") if isinstance(body, dict) else None
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return _error(400, "input: a text or a list of texts", "invalid_request_error")
        model = str(body.get("model", ""))
        found = [index.embeddings.get((model, t)) for t in texts]
        if any(v is None for v in found):
            return _error(404, f"no recorded embedding by {model!r} of that text", "not_found")
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(found)]
        return JSONResponse({"object": "list", "model": model, "data": data})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "owned_by": "ccpo-replay"}
                for m in sorted(index.models)
            ],
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "questions": index.n_questions, **stats}

    return app
