"""The signals of a round that need a call, and the hook that records a round's signals.

:func:`round_signals` runs after each round of a ladder with ``signals``, at collect and
serve time alike (:func:`ccpo.llm.protocol.run_round` calls it):

- the pure signals (lexical similarity, refusal markers) from the two replies;
- ``embedding``: the cosine of the replies' embeddings from an OpenAI-compatible
  ``/embeddings`` endpoint (the ladder's ``embedding_model``); a failing or slow endpoint
  leaves it missing (the policy then sees the lexical similarity and a missing flag), with the
  reason recorded and counted in :class:`SignalStats`;
- ``verdict``: the round's guide model says Yes/No on the base's reply with the free-text
  verdict prompt (:func:`ccpo.llm.prompts.free_verdict_messages`), a paid call of the round.

:func:`verify_reply` is a verify step's guide: the same verdict prompt on the reply of the
step before, by the ladder's verifier (a step of its own, not a signal).

A replay endpoint's recorded signals are taken as recorded (no call): a dry run equals the
replay. Contract: docs/design.md, section "Signals".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ccpo.llm.client import ChatRequest, Endpoint, LLMCallError, LLMClient
from ccpo.llm.prompts import FREE_VERDICT_VERSION, free_verdict_messages, verify_messages
from ccpo.llm.roles import Calls, GuideOutput, parse_verdict, verdict_uncertainty
from ccpo.traces.conversation import Conversation
from ccpo.traces.signals import text_signals
from ccpo.traces.similarity import cosine
from ccpo.traces.verify import VERDICT_MAX_TOKENS

log = logging.getLogger("ccpo.signals")

EMBEDDING_TIMEOUT = 10.0  # seconds, the default of ``embedding_timeout``


@dataclass
class SignalStats:
    """Counts of one run's signal calls: embeddings asked, embeddings that fell back to
    lexical similarity (failed, slow or malformed), verdicts asked."""

    embedding_calls: int = 0
    embedding_fallbacks: int = 0
    verdict_calls: int = 0


async def embedding_similarity(
    client: LLMClient,
    endpoint: Endpoint,
    a: str,
    b: str,
    timeout: float,
    stats: SignalStats,
) -> tuple[float | None, str | None]:
    """(cosine of the embeddings of ``a`` and ``b``, None) or (None, why it is missing).
    Empty replies are not sent: two are identical (1.0), one shares nothing (0.0)."""
    if not a.strip() or not b.strip():
        return (1.0 if a.strip() == b.strip() else 0.0), None
    stats.embedding_calls += 1
    try:
        u, v = await client.embed(endpoint, [a, b], timeout)
        sim = cosine(u, v)
        if sim is None:
            raise LLMCallError(f"{endpoint.where}: zero or mismatched embeddings")
        return sim, None
    except LLMCallError as e:
        stats.embedding_fallbacks += 1
        log.warning("embeddings unavailable, lexical similarity only: %s", e)
        return None, str(e)


async def _verdict_call(
    client: LLMClient, endpoint: Endpoint, messages: list[dict[str, str]], step: dict[str, str]
) -> GuideOutput:
    """A Yes/No verdict call: its verdict (``yes``/``no``/None) and ``1 − p(verdict token)``,
    or a replay endpoint's recorded ones (taken as recorded)."""
    req = ChatRequest(messages, temperature=0.0, max_tokens=VERDICT_MAX_TOKENS, step=step)
    r = await client.chat(endpoint, req)
    calls = Calls()
    calls.add(r)
    rec = r.recorded
    if rec is not None and "verdict" in rec:  # a replay endpoint's recorded verdict
        return GuideOutput(rec.get("verdict"), "", r.text, rec.get("uncertainty"), calls, rec)
    said, _ = parse_verdict(r.text)
    return GuideOutput(said, "", r.text, verdict_uncertainty(r.logprobs), calls)


async def free_verdict(
    client: LLMClient, endpoint: Endpoint, question: str, reply: str, t: int
) -> dict[str, Any]:
    """The recorded verdict of ``endpoint``'s model on ``reply`` (:class:`SignalVerdict`'s
    fields): ``yes``/``no``/None, ``1 − p(verdict token)``, its usage, the prompt version."""
    messages = free_verdict_messages(question, reply)
    g = await _verdict_call(client, endpoint, messages, {"round": str(t), "role": "verdict"})
    return {
        "model": endpoint.model,
        "verdict": g.verdict,
        "uncertainty": g.uncertainty,
        "usage": g.calls.usage(),
        "prompt": FREE_VERDICT_VERSION,
    }


async def verify_reply(
    client: LLMClient, endpoint: Endpoint, question: str | Conversation, reply: str, t: int
) -> GuideOutput:
    """A verify step's guide (round ``t``): ``endpoint``'s model asked with the free-text
    verdict prompt whether ``reply`` is acceptable for ``question`` (the whole conversation:
    :func:`ccpo.llm.prompts.verify_messages`); its answer is the reply, its verdict and
    uncertainty the call's (docs/design.md, "Ladders", "The verify step")."""
    g = await _verdict_call(
        client, endpoint, verify_messages(question, reply), {"round": str(t), "role": "guide"}
    )
    g.answer = reply
    return g


def recorded_signals(*recorded: dict | None) -> dict[str, Any] | None:
    """The round's signals a replay endpoint sent with one of its steps, else None."""
    for rec in recorded:
        if rec is not None and isinstance(rec.get("signals"), dict):
            return rec["signals"]
    return None


async def round_signals(
    client: LLMClient,
    ladder: Any,
    endpoints: dict[str, Endpoint],
    question: str,
    t: int,
    base: Any,
    guide: Any,
    stats: SignalStats,
    timeout: float = EMBEDDING_TIMEOUT,
) -> dict[str, Any]:
    """Round ``t``'s signals record (``ccpo.trace/v1``'s ``rounds[].signals``) for the
    ladder's ``signals``, from its ``base`` and ``guide`` outputs (``answer``, ``recorded``)."""
    replayed = recorded_signals(getattr(base, "recorded", None), getattr(guide, "recorded", None))
    if replayed is not None:
        return replayed
    out: dict[str, Any] = text_signals(base.answer, guide.answer)
    if ladder.round(t).verifies:  # its verdict is the round's own; no call compares the
        return out  # reply with itself (the featurizer compares it with the one before)
    if "embedding" in ladder.signals:
        ep = endpoints[ladder.embedding_model]
        sim, why = await embedding_similarity(client, ep, base.answer, guide.answer, timeout, stats)
        out["sim_embedding"], out["embedding_error"] = sim, why
    if "verdict" in ladder.signals:
        stats.verdict_calls += 1
        ep = endpoints[ladder.round(t).guide.model]
        out["verdict"] = await free_verdict(client, ep, question, base.answer, t)
    return out
