"""An LLM judge labels free-text replies: each rung's reply against the reference model's.

:func:`judge_traces` (``ccpo traces judge``) asks a judge model at any OpenAI-compatible
endpoint, through :class:`~ccpo.llm.client.LLMClient` (its response cache makes a rerun free,
its ledger counts the spend; :class:`JudgeCache` prices the replies the cache serves, what
earlier runs paid, so a resumed run knows the whole judging's spend), whether each ladder
model's reply to a conversation is as good as the reference model's reply to the same
conversation:

- ``rating``: a 1-10 rating of the reply given the reference reply (:func:`rating_messages`),
  accepted by an :class:`~ccpo.traces.accept.AcceptRule` (e.g. ``score>=8``);
- ``pairwise``: which of two replies is better, asked in both orders
  (:func:`pairwise_messages`); accepted unless the reference's reply wins in either order;
- ``both``: accepted when both accept.

Prompts are ours, versioned (:data:`PROMPT_VERSION`), at temperature 0. A reply without a
readable rating or verdict is asked once more (sample 1), then recorded as **unjudged**: its
question is left out and counted, never guessed (:class:`JudgeSummary`). The conversation is
:meth:`Trace.conversation <ccpo.traces.schema.Trace.conversation>`: a trace's ``messages``
when it has them, else its question as one user turn. Labels:
docs/design.md, "Labels from scores or a judge"; the guarantee: docs/theory.md, "Judged
acceptance".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.llm.cache import ResponseCache
from ccpo.llm.client import ChatRequest, Endpoint, LLMClient
from ccpo.traces.accept import AcceptRule
from ccpo.traces.conversation import Conversation
from ccpo.traces.labels import judged_labels
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import Trace
from ccpo.traces.signals import is_verify

PROMPT_VERSION = "ccpo-judge/1"
MODES = ("rating", "pairwise", "both")
MAX_TOKENS = 512

_RATING_SYSTEM = (
    "You grade one reply of an AI assistant to a conversation. You also get a reference reply "
    "to the same conversation, written by a strong model; use it to check facts and to see "
    "what a complete answer covers, but a different reply can be just as good. Judge whether "
    "the reply is correct, does what the user asked and helps them; length and style do not "
    "earn points. Give a short reason, then end with one line 'Rating: N', N an integer from "
    "1 to 10, where 8 or more means the reply serves the user at least as well as the "
    "reference."
)
_PAIRWISE_SYSTEM = (
    "You compare two replies of AI assistants to the same conversation. Judge which one is "
    "more correct and more helpful for what the user asked; length, order and style do not "
    "count. Give a short reason, then end with one line 'Verdict: A', 'Verdict: B' or "
    "'Verdict: tie'."
)
_RATING = re.compile(r"rating\s*[:=]?\s*\[*\s*(\d+(?:\.\d+)?)\s*\]*", re.I)
_VERDICT = re.compile(r"verdict\s*[:=]?\s*\[*\s*(a|b|tie)\b", re.I)


def _transcript(conversation: Conversation) -> str:
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in conversation.messages)


def rating_messages(conversation: Conversation, reference: str, reply: str) -> list[dict[str, str]]:
    """The rating prompt: the conversation, the reference reply, the reply to grade."""
    user = (
        f"<conversation>\n{_transcript(conversation)}\n</conversation>\n\n"
        f"<reference_reply>\n{reference}\n</reference_reply>\n\n"
        f"<reply_to_grade>\n{reply}\n</reply_to_grade>"
    )
    return [{"role": "system", "content": _RATING_SYSTEM}, {"role": "user", "content": user}]


def pairwise_messages(conversation: Conversation, first: str, second: str) -> list[dict[str, str]]:
    """The pairwise prompt: the conversation and replies A (``first``) and B (``second``)."""
    user = (
        f"<conversation>\n{_transcript(conversation)}\n</conversation>\n\n"
        f"<reply_A>\n{first}\n</reply_A>\n\n<reply_B>\n{second}\n</reply_B>"
    )
    return [{"role": "system", "content": _PAIRWISE_SYSTEM}, {"role": "user", "content": user}]


def parse_rating(text: str) -> float | None:
    """The last 'Rating: N' with 1 ≤ N ≤ 10 in a judge's reply; None when there is none."""
    found = [float(m.group(1)) for m in _RATING.finditer(text or "")]
    found = [x for x in found if 1 <= x <= 10]
    return found[-1] if found else None


def parse_verdict(text: str) -> str | None:
    """The last 'Verdict: A|B|tie' in a judge's reply (``"A"``, ``"B"``, ``"tie"``); None
    when there is none."""
    found = [m.group(1) for m in _VERDICT.finditer(text or "")]
    return None if not found else (found[-1].upper() if found[-1].lower() != "tie" else "tie")


@dataclass
class JudgeSummary:
    """What a judging run did (printed by the CLI)."""

    questions: int = 0
    written: int = 0
    replies: int = 0  # replies judged (reference replies and empty ones are not asked)
    accepted: int = 0
    retried: int = 0  # judge replies without a readable rating, asked once more
    unjudged: list[str] = field(default_factory=list)  # "<question>: <model>", never guessed
    no_reference: list[str] = field(default_factory=list)  # ids whose reference reply is empty
    spent_usd: float = 0.0  # by this run
    calls: int = 0  # paid (network) calls
    cached: int = 0  # calls served by the cache
    earlier_usd: float = 0.0  # what the replies the cache served cost the runs that paid them

    @property
    def total_usd(self) -> float:
        """The judging's spend so far: this run's and the earlier runs' it reused."""
        return self.spent_usd + self.earlier_usd

    @property
    def left_out(self) -> int:
        return self.questions - self.written


class JudgeCache(ResponseCache):
    """The response cache of a judging run, which prices the replies it serves: what the
    runs that paid for them spent (:attr:`earlier_usd`, at ``prices`` for ``model``, from the
    tokens each cached reply records). A reply this run put is not counted again."""

    def __init__(self, path: str | Path | None, prices: PriceTable, model: str) -> None:
        super().__init__(path)
        self.prices, self.model = prices, model
        self.earlier_usd = 0.0
        self._ours: set[str] = set()

    def get(self, key: str) -> dict[str, Any] | None:
        hit = super().get(key)
        if hit is not None and key not in self._ours:
            n_in, n_out = int(hit["input_tokens"]), int(hit["output_tokens"])
            self.earlier_usd += self.prices.cost(self.model, n_in, n_out)
        return hit

    def put(self, key: str, request: dict[str, Any], sample: int, response: dict[str, Any]) -> None:
        self._ours.add(key)
        super().put(key, request, sample, response)


@dataclass
class Judge:
    """A judge model at an endpoint, its mode, its acceptance rule on ratings and the client
    that calls it."""

    client: LLMClient
    endpoint: Endpoint
    mode: str = "rating"
    rule: AcceptRule | None = None
    summary: JudgeSummary = field(default_factory=JudgeSummary)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CCPOError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.mode != "pairwise" and self.rule is None:
            raise CCPOError(f"--mode {self.mode} needs an acceptance rule (--accept 'score>=8')")
        if self.rule is not None and self.rule.relative:
            raise CCPOError(
                f"--accept {self.rule.text}: the judge rates each reply against the reference "
                "model's reply, which it does not rate itself; use a number (e.g. 'score>=8')"
            )

    def labels(self, reference: str) -> str:
        return judged_labels(
            self.endpoint.model, reference, self.mode,
            None if self.mode == "pairwise" or self.rule is None else self.rule.text,
            PROMPT_VERSION,
        )  # fmt: skip

    async def _ask(self, messages: list[dict[str, str]], parse: Callable[[str], Any]) -> Any:
        """One judge question, asked again once (sample 1) when the reply cannot be read."""
        for sample in (0, 1):
            req = ChatRequest(messages, temperature=0.0, max_tokens=MAX_TOKENS, logprobs=False)
            res = await self.client.chat(self.endpoint, req, sample=sample)
            got = parse(res.text)
            if got is not None:
                return got
            if sample == 0:
                self.summary.retried += 1
        return None

    async def verdict(
        self, conversation: Conversation, reference: str, reply: str
    ) -> dict[str, Any]:
        """``{"accepted": bool | None, "rating": …, "pairwise": […]}`` for one reply; accepted
        None when the judge gave no readable answer (unjudged)."""
        out: dict[str, Any] = {}
        ok: list[bool | None] = []
        if self.mode in ("rating", "both"):
            rating = await self._ask(rating_messages(conversation, reference, reply), parse_rating)
            out["rating"] = rating
            ok.append(None if rating is None else self.rule.accepts(rating))  # type: ignore[union-attr]
        if self.mode in ("pairwise", "both"):
            ask = pairwise_messages
            first = await self._ask(ask(conversation, reply, reference), parse_verdict)
            second = await self._ask(ask(conversation, reference, reply), parse_verdict)
            out["pairwise"] = [first, second]  # the reply as A, then as B
            unread = first is None or second is None
            ok.append(None if unread else first != "B" and second != "A")
        out["accepted"] = None if None in ok else all(ok)
        return out


def reference_of(traces: Sequence[Trace], reference: str | None) -> str:
    """The reference model: ``reference`` (checked against the traces), else the model of the
    last round's guide (a cascade's strongest model)."""
    models = set().union(*(t.models() for t in traces)) if traces else set()
    if reference is not None:
        if reference not in models:
            raise CCPOError(
                f"--reference '{reference}' is not a model of the traces "
                f"({', '.join(sorted(models))})"
            )
        return reference
    return traces[0].rounds[-1].guide.model


async def judge_trace(judge: Judge, trace: Trace, reference: str) -> Trace | None:
    """``trace`` labelled by the judge (None when a reply stayed unjudged or the reference's
    reply is empty: left out and counted in the judge's summary)."""
    s = judge.summary
    replies: dict[str, str] = {}
    for r in trace.rounds:
        for step in (r.base,) if is_verify(r) else (r.base, r.guide):  # (not a verdict)
            if not step.reused:
                replies.setdefault(step.model, step.answer)
    ref_reply = replies.get(reference, "")
    if not ref_reply.strip():
        s.no_reference.append(trace.id)
        return None
    conversation = trace.conversation()
    todo = [m for m, a in replies.items() if m != reference and a.strip()]
    got = await asyncio.gather(*(judge.verdict(conversation, ref_reply, replies[m]) for m in todo))
    verdicts = dict(zip(todo, got, strict=True))
    s.replies += len(todo)
    missing = [m for m, v in verdicts.items() if v["accepted"] is None]
    if missing:
        s.unjudged.extend(f"{trace.id}: {m}" for m in missing)
        return None
    s.accepted += sum(v["accepted"] for v in verdicts.values())
    labelled = trace.model_copy(deep=True)
    for r in labelled.rounds:
        for step in (r.base, r.guide):
            m = r.base.model if is_verify(r) else step.model  # a verifier returns the reply
            v = verdicts.get(m)
            step.correct = m == reference or bool(v and v["accepted"])
            if v is not None:
                step.judge = {k: x for k, x in v.items() if k != "accepted"}
    labelled.gold = [ref_reply]
    labelled.meta = {**labelled.meta, "labels": judge.labels(reference)}
    return labelled


async def judge_traces(
    judge: Judge,
    traces: Sequence[Trace],
    reference: str | None = None,
    progress: Callable[[], None] | None = None,
) -> list[Trace]:
    """Every trace labelled by ``judge``, in order; the unjudged ones left out (counted in
    ``judge.summary``). ``progress()`` is called as each question finishes."""
    ref = reference_of(traces, reference)
    s = judge.summary
    s.questions = len(traces)

    async def one(t: Trace) -> Trace | None:
        try:
            return await judge_trace(judge, t, ref)
        finally:
            if progress is not None:
                progress()

    try:  # every question runs to its end: a call in flight is paid, so it is cached
        done = await asyncio.gather(*(one(t) for t in traces), return_exceptions=True)
    finally:
        c = judge.client
        s.spent_usd, s.calls, s.cached = c.spent_usd, c.n_calls, c.n_cached
        if isinstance(c.cache, JudgeCache):
            s.earlier_usd = c.cache.earlier_usd
    for d in done:  # the budget, or a judge that failed for good: after the rest settled
        if isinstance(d, BaseException):
            raise d
    out = [t for t in done if isinstance(t, Trace)]
    s.written = len(out)
    return out
