"""The agents of one round: base (chain-of-thought or ReAct), guide, LLM-as-policy, LLM-EXIT.

Definitions written into every trace (``meta.definitions``):

- **Guide uncertainty** = ``1 − p(verdict token)``, where the verdict token is the first
  generated token that is not white space or markup (``*``, quotes, brackets) — the token that
  says ``Yes`` or ``No`` — and ``p = exp(logprob)``. 0 means the guide is sure of its verdict.
  When the endpoint returns no log-probs (rejected or ignored), the uncertainty is ``null``.
- **Base log-prob stats**: ``logprob_mean`` / ``logprob_min`` over every generated token of
  the round (all ReAct steps together); ``null`` without log-probs.
- **Verdict parsing** (:func:`parse_verdict`): ``Yes`` → verdict ``yes`` and the guide's answer
  is the base answer; ``No [X]`` → verdict ``no`` and answer ``X`` (also ``No, X`` / ``no: X``
  and odd casing, punctuation, markdown); anything else → verdict ``null`` and the cleaned
  reply as the guide's answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ccpo.llm.client import ChatRequest, ChatResult, Endpoint, LLMClient, TokenLogprob
from ccpo.llm.prompts import (
    PastRound,
    chat_messages,
    cot_messages,
    exit_messages,
    guide_messages,
    react_messages,
)
from ccpo.llm.tasks.search import ReActEnv, SearchBackend
from ccpo.llm.wire import reply_sink, request_sampling
from ccpo.traces.answers import family_of
from ccpo.traces.conversation import Conversation

UNCERTAINTY_DEF = "1 - p(first verdict token); null without log-probs"
LOGPROB_DEF = "mean/min token log-prob over the round's generated tokens; null without log-probs"


@dataclass
class Calls:
    """Accumulated usage and token log-probs over one or more calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    logprobs: list[float] | None = field(default_factory=list)
    n: int = 0
    #: the last call's ``finish_reason`` as the endpoint sent it (``length``: cut at the cap)
    finish_reason: str | None = None

    def add(self, r: ChatResult) -> None:
        self.finish_reason = r.finish_reason
        self.input_tokens += r.input_tokens
        self.output_tokens += r.output_tokens
        self.n += 1
        if self.logprobs is not None:
            if r.logprobs is None:
                if r.output_tokens > 0:
                    self.logprobs = None
            else:
                self.logprobs.extend(t.logprob for t in r.logprobs)

    def stats(self) -> tuple[float | None, float | None]:
        return logprob_stats(self.logprobs)

    def usage(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


def logprob_stats(values: list[float] | None) -> tuple[float | None, float | None]:
    """(mean, min) of token log-probs, or (None, None) when unavailable or empty."""
    if not values:
        return None, None
    return sum(values) / len(values), min(values)


# ----------------------------------------------------------------------------- answers
_ANSWER_LINE = re.compile(r"(?:final\s+)?answer\s*(?:is)?\s*[:：]\s*(.+)", re.I)


_LETTER_ANSWER = re.compile(r"^\(?[A-J](?:$|[.:)]|\s*$)")  # "B", "(B)", "B) Mars", "B. Mars"
# "the answer is (D)", "Answer: option B", "choice C": the letter itself must be upper case
_LETTER_CLAIM = re.compile(
    r"(?i:\b(?:answer|option|choice)\s*(?:is|would be|:|：)?\s*(?:option\s*)?)\(?\**([A-J])\b"
)


def extract_answer(text: str, task: str = "jsonl", family: str | None = None) -> str:
    """The final answer of a CoT reply: the last ``Answer: X`` line, else the last line.

    For multiple choice (family ``mcq``, e.g. ``mmlu``), when that answer does not start with
    an option letter, the last letter the reply claims (``the answer is (D)``, ``option B``)
    is taken instead, so a model that ignores the output format still yields a letter.
    """
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    answer = _clean(lines[-1]) if lines else ""
    for ln in reversed(lines):
        m = _ANSWER_LINE.search(ln)
        if m:
            answer = _clean(m.group(1))
            break
    if family_of(task, family) == "mcq" and not _LETTER_ANSWER.match(answer):
        claims = _LETTER_CLAIM.findall(text)
        if claims:
            return claims[-1].upper()
    return answer


def _clean(s: str) -> str:
    s = s.strip().strip("*`_ ").rstrip(". *`_").strip()
    if len(s) > 1 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1].strip()
    return s.rstrip(".").strip()


_VERDICT = re.compile(r"^(yes|no)\b[\s.,:;!\-\u2013\u2014*]*(.*)$", re.I | re.S)
_PREFIX = re.compile(r"^(?:your\s+)?(?:response|answer|verdict)\s*[:：]\s*", re.I)


def parse_verdict(text: str) -> tuple[str | None, str | None]:
    """Parse a guide reply into (verdict, corrected answer).

    >>> parse_verdict("Yes")
    ('yes', None)
    >>> parse_verdict("No [Paris]")
    ('no', 'Paris')
    """
    s = text.strip().lstrip("*#>\"'` ").strip()
    s = _PREFIX.sub("", s).lstrip("*\"'` ").strip()
    m = _VERDICT.match(s)
    if not m:
        ans = _clean(s.splitlines()[0]) if s else ""
        return None, (ans or None)
    verdict = m.group(1).lower()
    if verdict == "yes":
        return "yes", None
    rest = m.group(2).strip()
    b = re.search(r"\[([^\]]*)\]", rest)
    if b:
        ans = _clean(b.group(1))
    else:
        first = rest.splitlines()[0] if rest else ""
        ans = _clean(first.strip("[]()"))
    return "no", (ans or None)


def verdict_uncertainty(logprobs: list[TokenLogprob] | None) -> float | None:
    """``1 − p(verdict token)``; None without log-probs (see the module docstring)."""
    if not logprobs:
        return None
    for t in logprobs:
        if t.token.strip().strip("*\"'`[]#>").strip():
            return float(min(1.0, max(0.0, 1.0 - math.exp(t.logprob))))
    return None


# ----------------------------------------------------------------------------- base agents
@dataclass
class BaseOutput:
    """One answer of a round: the base's (or, in an ``agree`` round, the guide's own)."""

    answer: str
    reasoning: str
    calls: Calls
    #: (logprob_mean, logprob_min) when they do not come from the calls' token log-probs (a
    #: replay endpoint's recorded values; an ``agree`` round's ``log p``)
    signals: tuple[float | None, float | None] | None = None
    #: what a replay endpoint recorded for this step (``ccpo_replay``), else None
    recorded: dict | None = None

    def logprob_stats(self) -> tuple[float | None, float | None]:
        return self.signals if self.signals is not None else self.calls.stats()


def recorded_base(r: ChatResult, reasoning: str, calls: Calls) -> BaseOutput | None:
    """The base output a replay endpoint recorded (its answer and log-prob signals, taken as
    recorded: a recorded answer is not parsed again), or None for a real endpoint's reply."""
    rec = r.recorded
    if rec is None or not isinstance(rec.get("answer"), str):
        return None
    return BaseOutput(
        answer=rec["answer"],
        reasoning=reasoning,
        calls=calls,
        signals=(rec.get("logprob_mean"), rec.get("logprob_min")),
        recorded=rec,
    )


@dataclass
class CoTAgent:
    """Chain-of-thought base agent (MMLU, generic JSONL, any task family)."""

    task: str
    max_tokens: int = 512
    family: str | None = None

    def messages(self, question: str | Conversation, history: list[PastRound]) -> list[dict]:
        """The request's messages."""
        assert isinstance(question, str)
        return cot_messages(self.task, question, history, self.family)

    def request(
        self, messages: list[dict], temperature: float, step: dict[str, str] | None
    ) -> ChatRequest:
        """The step's request, capped at :attr:`max_tokens`."""
        return ChatRequest(messages, temperature=temperature, max_tokens=self.max_tokens, step=step)

    def streams_to(self, step: dict[str, str] | None) -> Callable[[str], None] | None:
        """Where the reply of ``step`` streams to as it arrives (None: it is read whole): a
        chain of thought's never (its answer is extracted from the whole reply)."""
        return None

    def output(self, r: ChatResult, calls: Calls) -> BaseOutput:
        """The answer of a reply: the last ``Answer:`` line (:func:`extract_answer`)."""
        return recorded_base(r, r.text.strip(), calls) or BaseOutput(
            answer=extract_answer(r.text, self.task, self.family),
            reasoning=r.text.strip(),
            calls=calls,
        )

    async def run(
        self,
        client: LLMClient,
        endpoint: Endpoint,
        question: str | Conversation,
        history: list[PastRound],
        temperature: float,
        sample: int,
        context_backend: SearchBackend | None = None,
        step: dict[str, str] | None = None,
    ) -> BaseOutput:
        req = self.request(self.messages(question, history), temperature, step)
        r = await client.chat(endpoint, req, sample=sample, on_delta=self.streams_to(step))
        calls = Calls()
        calls.add(r)
        return self.output(r, calls)


UNCAPPED_REPLY_TOKENS = 32_768
"""The output tokens a chat step sent without a cap counts at its worst case (budgets): above
the longest logged reply of the bundled chat set (30,382 tokens, gpt-4-1106-preview)."""


@dataclass
class ChatAgent(CoTAgent):
    """The ``chat`` family's step: the conversation goes to the model unchanged (with the step's
    own ``system`` prompt in front, if it has one) and its reply is the answer, verbatim: no
    answer extraction, nothing stripped."""

    system: str | None = None
    #: the cap sent with each reply (None: none, the model's own limit; docs/deploy.md,
    #: "Conversations": the logged replies a chat ladder is calibrated on were not cut)
    cap: int | None = None

    def request(
        self, messages: list[dict], temperature: float, step: dict[str, str] | None
    ) -> ChatRequest:
        """The step's request: without a cap unless the ladder has one (budgets then count
        :data:`UNCAPPED_REPLY_TOKENS` as its worst case), with the sampling fields the
        client sent (:data:`~ccpo.llm.wire.request_sampling`) in place of the ladder's."""
        req = ChatRequest(
            messages,
            temperature=temperature,
            max_tokens=self.cap or UNCAPPED_REPLY_TOKENS,
            cap=self.cap is not None,
            step=step,
        )
        sampling = request_sampling.get()
        return req if sampling is None else sampling.apply(req)

    def streams_to(self, step: dict[str, str] | None) -> Callable[[str], None] | None:
        """The question's :data:`~ccpo.llm.wire.reply_sink` when it is this ``step``'s: the
        reply the policy decided to return before it was asked."""
        sink = reply_sink.get()
        return sink.put if sink is not None and step and sink.step == step else None

    def messages(self, question: str | Conversation, history: list[PastRound]) -> list[dict]:
        if history:
            raise ValueError("a chat step answers the conversation alone (no earlier rounds)")
        return chat_messages(question, self.system)

    def output(self, r: ChatResult, calls: Calls) -> BaseOutput:
        return recorded_base(r, "", calls) or BaseOutput(answer=r.text, reasoning="", calls=calls)


_ACTION_IN_REPLY = re.compile(r"Action\s*\d*\s*:\s*(search|lookup|finish)\s*\[([^\]\n]*)\]?", re.I)
_BARE_ACTION = re.compile(r"\b(search|lookup|finish)\s*\[([^\]\n]*)\]", re.I)
_THOUGHT_PREFIX = re.compile(r"^\s*Thought\s*\d*\s*:\s*", re.I)


@dataclass
class ReActAgent:
    """ReAct base agent (HotpotQA) with ``search`` / ``lookup`` / ``finish``, bounded steps.

    Each step sends the scratchpad so far (ending in ``Thought i:``) and stops the model at
    ``\\nObservation``; the action is parsed from its reply, run against the search backend,
    and the observation appended. If ``max_steps`` pass without ``finish``, one last call
    asks for ``Action i: finish[`` and takes the reply up to ``]`` as the answer.
    """

    max_steps: int = 6
    max_tokens: int = 200
    max_obs_chars: int = 800

    async def run(
        self,
        client: LLMClient,
        endpoint: Endpoint,
        question: str,
        history: list[PastRound],
        temperature: float,
        sample: int,
        context_backend: SearchBackend | None = None,
        step: dict[str, str] | None = None,
    ) -> BaseOutput:
        if context_backend is None:
            raise ValueError("the ReAct agent needs a search backend")
        env = ReActEnv(context_backend)
        calls = Calls()
        pad = ""
        for i in range(1, self.max_steps + 1):
            pad += f"Thought {i}:"
            req = ChatRequest(
                react_messages(question, history, pad),
                temperature=temperature,
                max_tokens=self.max_tokens,
                stop=[f"\nObservation {i}:", "\nObservation"],
                step=step,
            )
            r = await client.chat(endpoint, req, sample=sample)
            calls.add(r)
            replayed = recorded_base(r, (pad + r.text).strip(), calls)
            if replayed is not None:  # a replay endpoint answers the whole step at once
                return replayed
            reply = _THOUGHT_PREFIX.sub("", r.text.strip())
            m = _ACTION_IN_REPLY.search(reply) or _BARE_ACTION.search(reply)
            if m is None:
                thought = reply.strip().splitlines()[0] if reply.strip() else ""
                pad += f" {thought}\nAction {i}: (none)\n"
                pad += (
                    f"Observation {i}: Invalid action. Use search[entity], lookup[keyword]"
                    " or finish[answer].\n"
                )
                continue
            thought = reply[: m.start()].strip()
            thought = re.sub(r"\s*\n\s*", " ", thought)
            act, arg = m.group(1).lower(), m.group(2).strip()
            pad += f" {thought}\nAction {i}: {act}[{arg}]\n"
            if act == "finish":
                return BaseOutput(answer=_clean(arg), reasoning=pad.strip(), calls=calls)
            obs = await env.step(act, arg)
            obs = re.sub(r"\s+", " ", obs)[: self.max_obs_chars]
            pad += f"Observation {i}: {obs}\n"
        # out of steps: force a finish
        n = self.max_steps + 1
        pad += f"Thought {n}: I must answer now.\nAction {n}: finish["
        req = ChatRequest(
            react_messages(question, history, pad),
            temperature=temperature,
            max_tokens=32,
            stop=["]", "\n"],
            step=step,
        )
        r = await client.chat(endpoint, req, sample=sample)
        calls.add(r)
        ans = _clean(r.text.split("]")[0])
        pad += f"{ans}]"
        return BaseOutput(answer=ans, reasoning=pad.strip(), calls=calls)


# ----------------------------------------------------------------------------- guide
@dataclass
class GuideOutput:
    verdict: str | None
    answer: str
    raw: str
    uncertainty: float | None
    calls: Calls
    recorded: dict | None = None


@dataclass
class Guide:
    """The guide: judges the base's reasoning + answer with the paper's template."""

    max_tokens: int = 48

    async def judge(
        self,
        client: LLMClient,
        endpoint: Endpoint,
        question: str,
        reasoning: str,
        answer: str,
        sample: int = 0,
        step: dict[str, str] | None = None,
    ) -> GuideOutput:
        req = ChatRequest(
            guide_messages(question, reasoning, answer),
            temperature=0.0,
            max_tokens=self.max_tokens,
            step=step,
        )
        r = await client.chat(endpoint, req, sample=sample)
        calls = Calls()
        calls.add(r)
        rec = r.recorded
        if rec is not None and isinstance(rec.get("answer"), str):  # a replay endpoint's
            return GuideOutput(
                verdict=rec.get("verdict"),
                answer=rec["answer"],
                raw=r.text.strip(),
                uncertainty=rec.get("uncertainty"),
                calls=calls,
                recorded=rec,
            )
        verdict, corrected = parse_verdict(r.text)
        g_answer = answer if verdict == "yes" else (corrected or "")
        return GuideOutput(
            verdict=verdict,
            answer=g_answer,
            raw=r.text.strip(),
            uncertainty=verdict_uncertainty(r.logprobs),
            calls=calls,
        )


# ----------------------------------------------------------------------------- LLM decisions
_POLICY_DIGIT = re.compile(r"[123]")
POLICY_ACTIONS = {"1": "base", "2": "guide", "3": "next"}


def parse_policy_action(text: str) -> str | None:
    """'1'/'2'/'3' (first digit 1-3 in the reply) → base/guide/next; None if absent."""
    m = _POLICY_DIGIT.search(text)
    return POLICY_ACTIONS[m.group(0)] if m else None


def parse_exit(text: str) -> bool | None:
    """True for ``[EXIT]``, False for ``[CONTINUE]``, None when neither is recognisable."""
    t = text.upper()
    has_exit, has_cont = "EXIT" in t, "CONTINUE" in t
    if has_exit and not has_cont:
        return True
    if has_cont and not has_exit:
        return False
    if has_exit and has_cont:
        return t.index("EXIT") < t.index("CONTINUE")
    return None


@dataclass
class LLMDecision:
    action: str
    raw: str
    parsed: bool
    calls: Calls


async def _decide(client: LLMClient, endpoint: Endpoint, messages: list[dict]) -> tuple[str, Calls]:
    """A decision prompt asked at temperature 0 for a few tokens: the reply and its call."""
    req = ChatRequest(messages, temperature=0.0, max_tokens=8, logprobs=False)
    r = await client.chat(endpoint, req)
    calls = Calls()
    calls.add(r)
    return r.text, calls


async def policy_decision(
    client: LLMClient, endpoint: Endpoint, messages: list[dict[str, str]]
) -> LLMDecision:
    """LLM-as-policy (paper appendix template, :func:`~ccpo.llm.prompts.policy_messages`).
    Unparseable replies count as ``next``."""
    text, calls = await _decide(client, endpoint, messages)
    act = parse_policy_action(text)
    return LLMDecision(action=act or "next", raw=text.strip(), parsed=act is not None, calls=calls)


async def exit_decision(
    client: LLMClient, endpoint: Endpoint, question: str, answers: list[str]
) -> LLMDecision:
    """LLM-EXIT decision: ``base`` (= exit with this round's answer) or ``next``.

    Unparseable replies count as ``next`` (continue).
    """
    text, calls = await _decide(client, endpoint, exit_messages(question, answers))
    ex = parse_exit(text)
    return LLMDecision(
        action="base" if ex else "next", raw=text.strip(), parsed=ex is not None, calls=calls
    )


BaseAgent = CoTAgent | ReActAgent | ChatAgent
SearchFactory = Callable[[object], SearchBackend]
