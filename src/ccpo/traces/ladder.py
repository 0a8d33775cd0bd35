"""The ladder of a trace set: which model answers in each round, with which prompt, and how
the guide's verdict is made.

- :class:`Ladder` (:class:`LadderRound`, :class:`Step`): the list of T rounds; round t names
  its base step and its guide step (a model and the prompt it runs with) and its verdict mode,
  ``judge`` (the paper's: the guide replies ``Yes`` or ``No [answer]`` to the base) or
  ``agree`` (each answers alone; ``yes`` iff the answers are the same) or ``verify`` (a
  **verify step**: its base repeats the reply of the one-model step before it, its guide is
  a verifier model asked Yes/No on that reply; :func:`verify_round`).
  :meth:`Ladder.reused` names the earlier step a repeated call copies (paid once).
- :func:`ladder_of`, :func:`ladder_of_trace`: the ladder is data, read from a trace set and
  copied into every policy trained on it, with its ``signals`` (:mod:`ccpo.traces.signals`).
  Files without ladder fields read as a ``judge`` ladder of the models their rounds name.
- :func:`agree_signals` (an ``agree`` step's signals from its answer's probability),
  :func:`transfer_signal` (a repeated step's signal from its original's), :func:`default_prompt`
  (the prompt of a step recorded without one).

One piece of code runs a round of any ladder (:func:`ccpo.llm.protocol.run_round`).
Contract: docs/design.md, section "Ladders".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of
from ccpo.traces.signals import normalize_signals

VerdictMode = Literal["judge", "agree", "verify"]
VERDICT_MODES: tuple[str, ...] = ("judge", "agree", "verify")
#: the prompt of a verify step's verifier (the free-text verdict prompt, on the reply)
VERIFY = "verify"
Role = Literal["base", "guide"]

MIN_PROBABILITY = 1e-6  # a probability of 0 becomes log-prob log(1e-6), not −∞

#: the prompts the deployed agent knows how to write; any other name (e.g. a log's mode,
#: ``uala``) runs the family's own prompt (chain of thought; a ``chat`` family's conversation
#: as it is) and only tells steps apart
KNOWN_PROMPTS = ("cot", "react", "judge", "chat", VERIFY)
CHAT = "chat"  # the family whose question is a conversation, passed on unchanged


def agree_signals(p: float | None) -> tuple[float | None, float | None]:
    """The signals of an answer with probability ``p`` of being right, in an ``agree`` round:
    (the base's log-prob score ``log p``, the guide's uncertainty ``1 − p``), rounded to 9
    digits; (None, None) without a probability. The importer (``p`` = the row's confidence or
    exp(logprob)) and the live agent (``p`` = exp(mean token log-prob)) use this one
    definition."""
    if p is None:
        return None, None
    return round(math.log(max(p, MIN_PROBABILITY)), 9), round(1.0 - p, 9)


def transfer_signal(value: float | None, source: str, target: str) -> float | None:
    """A repeated step's signal from its original's (see :meth:`Ladder.reused`): copied
    within a role; across roles through :func:`agree_signals` (base score ``log p`` ↔ guide
    uncertainty ``1 − p``)."""
    if value is None or source == target:
        return value
    p = 1.0 - value if source == "guide" else math.exp(value)
    lp, u = agree_signals(p)
    return lp if target == "base" else u


def default_prompt(task: str, role: Role, verdict: str, family: str | None = None) -> str:
    """The prompt a step without a ``prompt`` field ran with: ``verify`` for a verify step's
    verifier, ``chat`` (the conversation as it is) in the ``chat`` family, ``judge`` for a
    judging guide, ReAct for a HotpotQA base in the paper's protocol, chain of thought
    otherwise."""
    if verdict == "verify" and role == "guide":
        return VERIFY
    if family_of(task, family) == CHAT:
        return "chat"
    if verdict == "judge":
        if role == "guide":
            return "judge"
        return "react" if task.lower() == "hotpotqa" else "cot"
    return "cot"


@dataclass(frozen=True)
class Step:
    """One call of a round: a model, the prompt it answers with and, in the ``chat`` family,
    an optional system prompt of its own sent in front of the conversation."""

    model: str
    prompt: str
    system: str | None = None

    def to_dict(self) -> dict[str, str]:
        d = {"model": self.model, "prompt": self.prompt}
        return d if self.system is None else {**d, "system": self.system}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        system = d.get("system")
        return cls(str(d["model"]), str(d["prompt"]), None if system is None else str(system))


@dataclass(frozen=True)
class LadderRound:
    """Round t of a ladder: its base step, its guide step and the verdict mode."""

    base: Step
    guide: Step
    verdict: str = "judge"

    def step(self, role: str) -> Step:
        return self.base if role == "base" else self.guide

    @property
    def one_model(self) -> bool:
        """A one-model step: an ``agree`` round whose guide repeats its base's call (one
        reply, paid once; :func:`ccpo.traces.signals.is_solo` on a recorded round)."""
        return self.verdict == "agree" and self.base == self.guide

    @property
    def verifies(self) -> bool:
        """A verify step: the verifier (guide) says Yes/No on the base's reply, the reply of
        the one-model step before it (docs/design.md, "Ladders", "The verify step")."""
        return self.verdict == "verify"


def verify_round(step: Step, verifier: str) -> LadderRound:
    """The verify step after the one-model step ``step``: its base repeats that call (the same
    reply, paid once), its guide is ``verifier`` with the free-text verdict prompt."""
    return LadderRound(step, Step(verifier, VERIFY), "verify")


def check_verify_rounds(rounds: tuple[LadderRound, ...], where: str = "ladder") -> None:
    """A :class:`CCPOError` unless every verify round follows the one-model step whose reply
    it verifies (its base that step's model and prompt) and is not the last round (its reply
    would be returned anyway: a verdict there buys nothing)."""
    for t, r in enumerate(rounds, start=1):
        if not r.verifies:
            continue
        prev = rounds[t - 2] if t >= 2 else None
        if prev is None or not prev.one_model or prev.base != r.base:
            raise CCPOError(
                f"{where}: round {t} verifies {r.base.model}'s reply, but round {t - 1} is not "
                f"a one-model step of {r.base.model} (a verify step follows the step it checks)"
            )
        if t == len(rounds):
            raise CCPOError(
                f"{where}: round {t}, the last, verifies {r.base.model}'s reply; a verify step "
                "needs a step after it (the last reply is returned anyway)"
            )


@dataclass(frozen=True)
class Ladder:
    """The rounds of a trace set (or of a deployment), with the task they answer."""

    task: str
    family: str
    rounds: tuple[LadderRound, ...]
    signals: tuple[str, ...] = ()  # canonical order (ccpo.traces.signals.SIGNALS)
    embedding_model: str | None = None  # the ``embedding`` signal's model

    def __post_init__(self) -> None:
        check_verify_rounds(self.rounds)

    @property
    def T(self) -> int:
        return len(self.rounds)

    def models(self) -> list[str]:
        """Every model the ladder calls, in order of first use."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            seen.setdefault(r.base.model)
            seen.setdefault(r.guide.model)
        return list(seen)

    def verdicts(self) -> set[str]:
        """The verdict modes its rounds use."""
        return {r.verdict for r in self.rounds}

    def round(self, t: int) -> LadderRound:
        """Round ``t`` (1-based)."""
        return self.rounds[t - 1]

    def reused(self, t: int, role: str, start: int = 1) -> tuple[int, str] | None:
        """The earlier step (round, role) whose call step (``t``, ``role``) repeats, or None
        (docs/design.md, "Ladders": only ``agree`` rounds repeat calls). ``start``: the first
        round run (a routed question skips rounds before it: their calls were not made). A
        verify step's base repeats the step before it (its guide, the verifier, never
        repeats)."""
        r = self.round(t)
        if r.verifies:
            return (t - 1, "base") if role == "base" and t - 1 >= start else None
        if r.verdict != "agree":
            return None
        me = r.step(role)
        order = [(u, ro) for u in range(start, t + 1) for ro in ("base", "guide")]
        for u, ro in order[: order.index((t, role))]:
            if self.round(u).verdict == "agree" and self.round(u).step(ro) == me:
                return u, ro
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in a policy's provenance (``ladder``); ``signals`` and
        ``embedding_model`` only when set (so a ladder without signals is written as before)."""
        d: dict[str, Any] = {
            "task": self.task,
            "family": self.family,
            "rounds": [
                {"base": r.base.to_dict(), "guide": r.guide.to_dict(), "verdict": r.verdict}
                for r in self.rounds
            ],
        }
        if self.signals:
            d["signals"] = list(self.signals)
        if self.embedding_model:
            d["embedding_model"] = self.embedding_model
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "ladder") -> Ladder:
        """The ladder of :meth:`to_dict` (a clear :class:`CCPOError` for a malformed one)."""
        try:
            task = str(d["task"])
            rounds = tuple(
                LadderRound(
                    Step.from_dict(r["base"]),
                    Step.from_dict(r["guide"]),
                    str(r.get("verdict", "judge")),
                )
                for r in d["rounds"]
            )
            family = family_of(task, d.get("family"))
            embedding = d.get("embedding_model")
            embedding = None if embedding is None else str(embedding)
            signals = normalize_signals(d.get("signals") or (), embedding, where)
        except (KeyError, TypeError, ValueError) as e:
            raise CCPOError(f"{where}: malformed ladder ({e})") from None
        for r in rounds:
            if r.verdict not in VERDICT_MODES:
                raise CCPOError(f"{where}: verdict '{r.verdict}' is not judge, agree or verify")
        if not rounds:
            raise CCPOError(f"{where}: a ladder needs at least one round")
        check_verify_rounds(rounds, where)
        return cls(task, family, rounds, signals, embedding)

    @classmethod
    def one_pair(cls, task: str, base: str, guide: str, rounds: int, family: str | None = None):
        """The paper's protocol: the same base and guide every round, ``judge`` verdicts (in the
        ``chat`` family, whose replies are free text, ``agree`` rounds of the conversation)."""
        fam = family_of(task, family)
        verdict = "agree" if fam == CHAT else "judge"
        b = Step(base, default_prompt(task, "base", verdict, fam))
        g = Step(guide, default_prompt(task, "guide", verdict, fam))
        return cls(task, fam, tuple(LadderRound(b, g, verdict) for _ in range(rounds)))

    def describe(self) -> str:
        """One line per round, for messages and ``--help`` output (and the signals)."""
        rounds = "; ".join(
            f"round {t}: {r.guide.model} verifies {r.base.model}'s reply"
            if r.verifies
            else f"round {t}: {r.base.model}"
            + (" (one model)" if r.one_model else f" → {r.guide.model} ({r.verdict})")
            for t, r in enumerate(self.rounds, start=1)
        )
        return f"{rounds}; signals: {', '.join(self.signals)}" if self.signals else rounds


def ladder_of_trace(tr: Any) -> Ladder:
    """The ladder one trace followed (defaults for files without ladder fields: a ``judge``
    ladder; the base's prompt is the agent ``ccpo collect`` recorded in ``meta.agent``, and
    chain of thought for a file that does not say, so that a file from elsewhere never
    needs a search tool it did not use)."""
    rounds = []
    agent = (getattr(tr, "meta", None) or {}).get("agent")
    family = family_of(tr.task, getattr(tr, "family", None))
    for r in tr.rounds:
        verdict = getattr(r, "verdict_mode", None) or "judge"
        b, g = r.base, r.guide
        base_default = agent if verdict == "judge" and agent in ("cot", "react") else "cot"
        if family == CHAT:
            base_default = "chat"
        rounds.append(
            LadderRound(
                Step(b.model, getattr(b, "prompt", None) or base_default, _system(b)),
                Step(
                    g.model,
                    getattr(g, "prompt", None) or default_prompt(tr.task, "guide", verdict, family),
                    _system(g),
                ),
                verdict,
            )
        )
    return Ladder(
        tr.task,
        family,
        tuple(rounds),
        tuple(getattr(tr, "signals", None) or ()),
        getattr(tr, "embedding_model", None),
    )


def _system(step: Any) -> str | None:
    return getattr(step, "system", None)


def ladder_of(traces: Iterable[Any], where: str = "traces") -> Ladder:
    """The ladder of a trace set: every trace must follow the same one (a set mixing ladders
    cannot be deployed as one policy)."""
    first: Ladder | None = None
    first_id = ""
    for tr in traces:
        lad = ladder_of_trace(tr)
        if first is None:
            first, first_id = lad, tr.id
        elif lad != first:
            raise CCPOError(
                f"{where}: trace '{tr.id}' follows another ladder than '{first_id}' "
                f"({lad.describe()} vs {first.describe()}); a trace set has one ladder"
            )
    if first is None:
        raise CCPOError(f"{where}: no traces")
    return first
