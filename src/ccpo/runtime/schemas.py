"""The wire models of ``ccpo serve`` (requests, responses, errors), its OpenAI-compatible
chat-completion models, and :class:`ApiError`, the error a handler raises. Pydantic only:
importable without the ``serve`` extra (the app is :mod:`ccpo.runtime.server`).

The requests (:class:`AnswerRequest`, :class:`FeedbackRequest`, :class:`ChatCompletionRequest`)
are :class:`Storable`: no string anywhere in one may hold what a state database refuses (a NUL
character, a lone surrogate), so such a request is a 422 naming the field before anything is
written (docs/deploy.md, "When the database falters").

A request's ``messages`` are parsed here, once, into a
:class:`~ccpo.traces.conversation.Conversation` (:attr:`AnswerRequest.conversation`); every
layer below takes that object (docs/design.md, "Conversations")."""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ccpo.llm.wire import Sampling
from ccpo.runtime.answer_set import AnswerSet
from ccpo.runtime.state.db import unstorable
from ccpo.traces.conversation import Conversation, ConversationError, conversation_of

CHAT_MODEL = "ccpo"
"""The model name of the OpenAI-compatible endpoint."""


def _refused(text: str) -> bool:
    """``text`` holds what a database refuses (:func:`unstorable`; ASCII without NUL at once)."""
    return "\x00" in text or (not text.isascii() and unstorable(text) is not None)


def _path_to_unstorable(value: Any) -> tuple[tuple[Any, ...], str] | None:
    """The path in ``value`` (JSON: text, dicts, lists) to the first text a database refuses
    (for a key: the path to its dict, then the key), and that text; None when there is none."""
    kind = type(value)
    if kind is str:
        return ((), value) if _refused(value) else None
    items: Any = value.items() if kind is dict else enumerate(value) if kind is list else ()
    for k, v in items:
        if type(k) is str and _refused(k):
            return (k,), k
        found = _path_to_unstorable(v)
        if found is not None:
            return (k, *found[0]), found[1]
    return None


def _first_unstorable(value: Any) -> str | None:
    """Where in ``value`` the first text a database cannot store is, and why (None: none)."""
    found = _path_to_unstorable(value)
    if found is None:
        return None
    where, why = ".".join(str(k) for k in found[0]), unstorable(found[1])
    return f"{where}: {why}" if where else why


UNSTORABLE = "unstorable"  # the error type of text a database refuses (its message has the path)


class Storable(BaseModel):
    """A request model whose every string, at any depth of the request as sent (fields,
    nested objects and lists, extra fields, keys), can be stored by either state database:
    else one validation error of type :data:`UNSTORABLE` whose message names the path
    (``messages.0.content: it contains a NUL character``). Checked once, on the raw input,
    before any field is parsed (a lone surrogate would otherwise fail as "not a string")."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        why = _first_unstorable(data) if isinstance(data, dict) else None
        if why is not None:
            raise PydanticCustomError(UNSTORABLE, "{why}", {"why": why})
        return cls._parse(data)

    @classmethod
    def _parse(cls, data: Any) -> Any:
        """What a request parses of its raw input once it is known storable (nothing here)."""
        return data


# ----------------------------------------------------------------------------- native
def _conversation(value: Any, handler: ValidatorFunctionWrapHandler) -> Conversation:
    """``messages`` as a conversation: as parsed at the edge (:meth:`AnswerRequest._parse`,
    :meth:`ChatCompletionRequest.answer_request`), the refusal carried from there, or what
    the field's type says of input that is no non-empty list of objects."""
    if isinstance(value, Conversation):
        return value
    if isinstance(value, ConversationError):
        raise ValueError(str(value))
    try:  # (input _parse did not read: none from JSON)
        return conversation_of(handler(value), "message")
    except ConversationError as e:
        raise ValueError(str(e)) from None


if TYPE_CHECKING:
    Messages = Conversation
else:  # validated as the wire's list of messages (as the OpenAPI spec shows it)
    Messages = Annotated[
        list[dict[str, Any]],
        Field(min_length=1),
        WrapValidator(_conversation),
        PlainSerializer(Conversation.as_list),
    ]


class ContextParagraph(BaseModel):
    """One paragraph for the offline search tool (hotpotqa)."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1)
    text: str


class AnswerRequest(Storable):
    """A question to answer."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, description="the question (not blank)")
    id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:\-]+$",
        description="your id for it (for feedback); generated when absent",
    )
    context: list[ContextParagraph] | None = Field(
        None, max_length=100, description="paragraphs for the search tool (hotpotqa)"
    )
    max_cost_usd: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="per-request budget in USD (can only tighten the server's)",
    )
    conversation: Messages | None = Field(
        None,
        alias="messages",
        description="the conversation (OpenAI messages of text: system, earlier user and "
        "assistant turns, the new user turn): a chat policy's models receive it whole; "
        "'question' may then be left out (it is the last user turn)",
    )

    @classmethod
    def _parse(cls, data: Any) -> Any:
        """The one parse of ``messages`` (a non-empty list of objects) into a conversation,
        whose last user turn is the question when it is left out; a refusal is carried to the
        field, whose 422 names it."""
        if not isinstance(data, dict):
            return data
        msgs = data.get("messages")
        if isinstance(msgs, list | tuple) and msgs and all(isinstance(m, dict) for m in msgs):
            try:
                msgs = conversation_of(msgs, "message")
            except ConversationError as e:
                msgs = e
            data = {**data, "messages": msgs}
        if isinstance(msgs, Conversation) and "question" not in data:
            data = {**data, "question": msgs.text}
        return data

    @field_validator("question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the question is blank")
        return v

    @model_validator(mode="after")
    def _question_is_last_turn(self) -> AnswerRequest:
        if self.conversation is not None and self.conversation.text != self.question:
            raise ValueError("question: not the last user turn of messages (leave it out)")
        return self


class FeedbackRequest(Storable):
    """The truth about a served question: its correct answer, that none of the returned
    answers was right, or that it was unanswerable (no model of the ladder could have
    answered it: counted as covered, as calibration counts such a question)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128, description="the id of the answer set")
    correct_answer: str | None = Field(
        None, min_length=1, description="the correct answer (matched with the task normaliser)"
    )
    none_of_them: bool = Field(False, description="no returned answer was correct")
    unanswerable: bool = Field(
        False,
        description="no model of the policy's ladder could have answered it (counted as "
        "covered, as in calibration)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> FeedbackRequest:
        given = (self.correct_answer is not None) + self.none_of_them + self.unanswerable
        if given != 1:
            raise ValueError(
                "give exactly one of 'correct_answer', 'none_of_them': true or 'unanswerable': true"
            )
        return self


class FeedbackResponse(BaseModel):
    id: str
    covered: bool = Field(description="the correct answer was in the returned set")
    kappa: float | None = Field(description="κ in force after this feedback")
    coverage: float = Field(description="running coverage over all feedback")
    feedback: int = Field(description="feedback received so far")


class ServerMetrics(BaseModel):
    """What ``/metrics.json`` reports (and ``/metrics`` in the Prometheus format)."""

    requests: int = Field(description="questions answered")
    errors: int = Field(description="questions that failed (upstream error, budget)")
    rejected: int = Field(description="requests refused before any LLM call")
    dollars_spent: float = Field(description="USD paid to the LLM endpoints (cache hits free)")
    cost_usd: float = Field(description="Σ cost_usd of answered questions (usage × price)")
    mean_set_size: float | None
    mean_rounds: float | None
    feedback: int
    coverage: float | None = Field(description="share of feedback that was covered")
    recent_coverage: float | None = Field(description="the same over the last 200 feedbacks")
    recent_feedback: int = Field(0, description="feedbacks in the recent window (≤ 200)")
    coverage_target: float | None = Field(None, description="the coverage target 1 − α")
    coverage_short: bool = Field(
        False,
        description="recent coverage is below 1 − α beyond noise (the Clopper-Pearson 95% "
        "interval lies below it); serve logs a warning",
    )
    kappa: float | None = Field(description="κ in force")
    kappa_artifact: float | None = Field(description="κ of the artifact (or the config)")
    kappa_lower: float | None = Field(description="the lowest κ feedback may reach")
    kappa_upper: float | None = Field(description="the highest κ feedback may reach")
    kappa_level: float | None = Field(
        None,
        description="the calibration level u of online κ (κ = Q(u), the split-conformal "
        "threshold at level u of the policy's calibration scores; starts at α); None for a "
        "policy without calibration scores",
    )
    kappa_moves: int = Field(description="feedbacks that moved κ")
    kappa_clamped: int = Field(description="κ steps cut short by the step bound or the band")
    alpha: float
    adapt_kappa: bool
    budget_usd: float | None = Field(description="the total budget (max_cost_total)")
    inflight_usd: float = Field(
        description="USD counted as spent should its replica die: the wallets of questions "
        "being answered, from which their calls draw their worst cases"
    )
    reserved_usd: float = Field(
        0.0, description="all money reserved: calls in flight and questions admitted"
    )
    replica: str = Field("", description="this replica's id (the metrics are the shared state's)")
    state_commits: int = Field(
        0,
        description="write transactions this replica committed to the state since it started "
        "(its own, unlike the shared values above; one commits every operation pending at once)",
    )
    state_commits_whole: int = Field(
        0,
        description="of them, those sent whole: computed ahead from the state as this replica "
        "left it and written in one guarded statement (PostgreSQL, while no other replica "
        "writes in between)",
    )
    state_commits_here: int = Field(
        0,
        description="of those, committed on the event loop itself: a lone question's answer "
        "on a SQLite file, where the commit only appends to the log and never waits",
    )
    route_embeddings: int = Field(
        0, description="question embeddings this replica asked for before routing"
    )
    route_fallbacks: int = Field(
        0,
        description="of them, those missing (failed, slow or malformed): routed by the text "
        "alone, as calibrated",
    )
    uptime_s: float
    hedged: int = Field(0, description="guide calls sent ahead (hedge_above), this replica's")
    hedges_cancelled: int = Field(0, description="of them, cancelled as not needed")
    errors_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="this replica's 5xx answers by kind (the error body's type: "
        "upstream_error, policy_error, budget_exhausted, ...), since it started",
    )


class Health(BaseModel):
    status: str = Field(
        description="ok, or degraded (the state database is away: questions "
        "get 503 state_unavailable until it is back; or the policy failed on the last 3 "
        "questions in a row)"
    )
    policy: str
    horizon: int
    alpha: float
    kappa: float | None
    detail: str | None = Field(None, description="why degraded")


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict | None = None):
        self.status, self.type, self.message, self.headers = status, type_, message, headers
        super().__init__(message)


# ----------------------------------------------------------------------------- OpenAI-compatible
class ChatMessage(BaseModel):
    """One chat message: text content, or a list of text parts ({"type": "text", "text":
    "..."}); any other part (an image, audio, a part without text) is refused."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        for i, part in enumerate(v if isinstance(v, list) else []):
            kind = part.get("type", "text")
            if kind != "text":
                raise ValueError(
                    f"part {i} is of type {kind!r}; only text parts are supported "
                    '({"type": "text", "text": "..."})'
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {i}: 'text' must be a string")
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p["text"] for p in self.content)
        return self.content or ""


class CcpoOptions(BaseModel):
    """The native request fields, passed as ``extra_body={"ccpo": {...}}``."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = AnswerRequest.model_fields["id"]
    context: list[ContextParagraph] | None = AnswerRequest.model_fields["context"]
    max_cost_usd: float | None = AnswerRequest.model_fields["max_cost_usd"]


#: OpenAI request fields ccpo cannot honour, refused rather than ignored: field → (the values
#: that mean the same as leaving it out, why)
UNSUPPORTED_CHAT_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((1,), "one completion per request: the answer set is one reply"),
    "tools": (([],), "no tool calls: ccpo answers questions"),
    "tool_choice": (("none",), "no tool calls: ccpo answers questions"),
    "functions": (([],), "no function calls: ccpo answers questions"),
    "function_call": (("none",), "no function calls: ccpo answers questions"),
    "logprobs": ((False,), "no log-probabilities: the answer set is not one sampled text"),
    "top_logprobs": ((0,), "no log-probabilities: the answer set is not one sampled text"),
    "response_format": (({"type": "text"},), "the reply is the answer set, one per line"),
}


class ChatCompletionRequest(Storable):
    """An OpenAI chat-completion request. Sampling fields: a chat policy passes
    ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p`` and ``stop`` on
    to its models (:meth:`sampling`); another family, and other sampling fields, ignore them
    (the policy decides); fields that would change what the
    reply is (n > 1, tools, tool_choice, functions, function_call, logprobs, top_logprobs,
    response_format other than text) are refused with a 422 naming them."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(description="must be 'ccpo'")
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = Field(
        False,
        strict=True,
        description="answer as server-sent events: the content (the one answer, or the set "
        "one line per chunk) once the policy stops, the full answer set as ccpo in the last "
        "chunk, then [DONE] (the policy decides first: nothing streams before it has)",
    )
    ccpo: CcpoOptions | None = Field(None, description="native fields of POST /v1/answer")

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        given = self.model_extra or {}
        for name, (same, why) in UNSUPPORTED_CHAT_FIELDS.items():
            value = given.get(name)
            if value is not None and value not in same:
                raise ValueError(f"{name}: not supported ({why}); leave it out")
        return self

    def answer_request(self, conversation: bool = False) -> AnswerRequest:
        """The native request: the last user message is the question; with ``conversation``
        (a chat policy), the messages too, checked: a 422 names what cannot be passed on."""
        if self.model != CHAT_MODEL:
            raise ApiError(
                404, "model_not_found", f"model '{self.model}' does not exist; use '{CHAT_MODEL}'"
            )
        users = [m for m in self.messages if m.role == "user"]
        if not users:
            raise ApiError(422, "invalid_request", "messages: no user message (the question)")
        opts = self.ccpo.model_dump(exclude_none=True) if self.ccpo else {}
        if conversation:
            try:  # the one parse of this request's conversation
                opts["messages"] = conversation_of([m.model_dump() for m in self.messages])
            except ConversationError as e:
                raise ApiError(422, "invalid_request", str(e)) from None
        try:
            return AnswerRequest.model_validate({"question": users[-1].text(), **opts})
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ())) or "body"
            msg = str(first["msg"]).removeprefix("Value error, ")
            if first["type"] != UNSTORABLE:  # (its message has the path already)
                msg = f"{loc}: {msg}"
            raise ApiError(422, "invalid_request", msg) from None

    def sampling(self) -> Sampling | None:
        """The sampling fields given (None: none), checked: a 422 names a wrong one."""
        given = self.model_extra or {}
        cap = given.get("max_completion_tokens", given.get("max_tokens"))
        temp, top_p, stop = given.get("temperature"), given.get("top_p"), given.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        checks = (
            ("max_tokens", cap, isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1,
             "a whole number of tokens, at least 1"),
            ("temperature", temp, _number(temp) and 0 <= temp <= 2, "a number from 0 to 2"),
            ("top_p", top_p, _number(top_p) and 0 < top_p <= 1, "a number in (0, 1]"),
            ("stop", stop, isinstance(stop, list) and len(stop) <= 4
             and all(isinstance(x, str) and x for x in stop), "up to 4 non-empty strings"),
        )  # fmt: skip
        for name, value, ok, what in checks:
            if value is not None and not ok:
                raise ApiError(422, "invalid_request", f"{name}: must be {what}")
        if cap is None and temp is None and top_p is None and not stop:
            return None
        return Sampling(cap, temp, top_p, tuple(stop) if stop else None)

    def dropped(self) -> list[str]:
        """What a policy of another family than ``chat`` does not pass on (:func:`dropped`)."""
        return dropped([m.role for m in self.messages])


def dropped(roles: list[str]) -> list[str]:
    """What a policy of another family than ``chat`` does not pass on of messages of these
    ``roles``: ``system`` (system or developer messages) and ``history`` (any message but the
    last user turn)."""
    users = [i for i, r in enumerate(roles) if r == "user"]
    system = any(r in ("system", "developer") for r in roles)
    others = [i for i, r in enumerate(roles) if r not in ("system", "developer")]
    return [*(["system"] if system else []), *(["history"] if others != users[-1:] else [])]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


class ChatChoice(BaseModel):
    index: int
    message: dict[str, str]
    finish_reason: str


def chat_content(s: AnswerSet, reply: bool = False) -> str:
    """The message content of a chat completion: exactly the one answer of a single-answer
    policy (no newline; empty when it has none), the set of a set policy one answer per line.
    An empty answer is never in the set, so it never shows as content. With ``reply`` (a chat
    policy), the chosen reply whole, as the model wrote it, whatever the policy's kind."""
    if reply or (s.guarantee is not None and s.guarantee.answer == "single"):
        return s.answer or ""
    return "\n".join(s.answers)


class ChatCompletion(BaseModel):
    """An OpenAI chat completion whose content is the one answer of a single-answer policy, or
    the answer set, one answer per line, of a set policy (:func:`chat_content`), with the full
    answer set (set, one answer, guarantee, rounds, models paid, cost) as ``ccpo``."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    ccpo: AnswerSet


def completion_chunk(
    id: str, created: int, delta: dict[str, str], finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` event of completion ``id``."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": id, "object": "chat.completion.chunk", "created": created,
            "model": CHAT_MODEL, "choices": [choice], **extra}  # fmt: skip


def chat_completion_chunks(s: AnswerSet, reply: bool = False) -> list[dict[str, Any]]:
    """The answer set as the ``chat.completion.chunk`` events of a streamed completion (as the
    ``openai`` SDK reads them): the role, the content (:func:`chat_content`: a single-answer
    policy's one answer in one chunk; a set one answer per chunk, as lines; with ``reply``, a
    chat policy's reply one line per chunk, its line ends kept), then an empty delta with
    ``finish_reason: stop`` and the full answer set as ``ccpo``."""
    chunk = functools.partial(completion_chunk, f"chatcmpl-{s.id}", int(time.time()))
    if reply:
        parts = chat_content(s, reply).splitlines(keepends=True)
    else:
        lines = chat_content(s).split("\n")
        parts = [a if i == 0 else "\n" + a for i, a in enumerate(lines) if a or i]
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in parts),
        chunk({}, finish_reason(s, reply), ccpo=s.model_dump(mode="json")),
    ]


def finish_reason(s: AnswerSet, reply: bool = False) -> str:
    """A chat completion's ``finish_reason``: a chat policy's, the endpoint's for the reply it
    returns (``length`` when it was cut); else ``stop`` (the content is the policy's)."""
    return (s.finish_reason or "stop") if reply else "stop"


def chat_completion(s: AnswerSet, reply: bool = False) -> ChatCompletion:
    """The answer set as an OpenAI chat completion (``reply``: see :func:`chat_content`)."""
    return ChatCompletion(
        id=f"chatcmpl-{s.id}",
        created=int(time.time()),
        model=CHAT_MODEL,
        choices=[
            ChatChoice(
                index=0,
                message={"role": "assistant", "content": chat_content(s, reply)},
                finish_reason=finish_reason(s, reply),
            )
        ],
        ccpo=s,
    )
