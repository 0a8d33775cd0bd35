"""The episode started at a later round: what a routed question runs, sees and pays.

A router (:mod:`ccpo.policies.routing.single`) picks, before any call, the round s at which a
question starts; rounds before s are neither called nor paid. This module gives, for every start s,
the replay's view of each trace, shared with the live agent so that both compute the same numbers:

- :data:`BLANK_ROUND` and :func:`routed_rounds`: skipped rounds are replaced by one fixed blank
  round (no answer, no verdict, no usage), so o_t of a routed episode is the featurizer over
  rounds 1..t with those blanks, live and replay alike;
- :func:`paid_steps`, :func:`started_rounds`: which steps of rounds ≥ s are paid and at what
  usage (a step that repeats a call of a skipped round is called where first needed: an
  ``agree`` ladder's base of round s is round s − 1's guide; a verify step's base, the reply
  it verifies, is the step before it), and the rounds o_t is made of;
- :class:`RouteViews` (:func:`route_views`): observations [S, N, T, F], round costs and
  estimated round seconds [S, N, T] of every start, and the question texts; ``None`` unless
  every round is an ``agree`` round or a verify step.

Derivation: docs/theory.md, "Routing before the first call".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from ccpo.traces.featurize import featurize_rounds
from ccpo.traces.ladder import ladder_of_trace
from ccpo.traces.latency import call_seconds
from ccpo.traces.prices import PriceTable

_ZERO = SimpleNamespace(input_tokens=0, output_tokens=0)
BLANK_ROUND = SimpleNamespace(
    base=SimpleNamespace(model="", answer="", usage=_ZERO, logprob_mean=None, logprob_min=None),
    guide=SimpleNamespace(model="", answer="", usage=_ZERO, verdict=None, uncertainty=None),
)
"""A skipped round as the featurizer sees it (never priced, never returned)."""


def routed_rounds(rounds: Sequence[Any], start: int) -> list[Any]:
    """Rounds ``start``.. (0-based) of ``rounds`` after ``start`` blank rounds: what the
    featurizer reads for a question started at round ``start + 1``."""
    return [BLANK_ROUND] * start + list(rounds[start:])


def routable(trace: Any) -> bool:
    """Whether a trace's ladder can be routed: every round an ``agree`` round or a verify step
    (a ``judge`` round's base reads the earlier rounds, which a skip would change; a verify
    step started at calls the reply it verifies, then the verifier)."""
    return all(r.verdict in ("agree", "verify") for r in ladder_of_trace(trace).rounds)


def _paid_usage(trace: Any, ladder: Any, t: int, role: str, start: int) -> Any | None:
    """The usage step (``t``, ``role``) is paid at when the question starts at round
    ``start + 1``: its own (not a repeat), its original's (a repeat of a skipped round's call
    not made again since), or ``None`` (a repeat of a call made: free)."""
    s = getattr(trace.rounds[t - 1], role)
    if not getattr(s, "reused", False):
        return s.usage
    if ladder.reused(t, role, start + 1) is not None:
        return None
    src = ladder.reused(t, role)
    return s.usage if src is None else getattr(trace.rounds[src[0] - 1], src[1]).usage


def paid_steps(trace: Any, start: int) -> list[list[tuple[str, Any]]]:
    """Per round t ≥ ``start`` (0-based) of a routable trace, the steps paid as (model, usage):
    a step not stored as a repeat, or a repeat whose original call lies in a skipped round and
    was not made again since (it is called here, at its original's usage)."""
    ladder = ladder_of_trace(trace)
    out: list[list[tuple[str, Any]]] = []
    for t in range(start + 1, trace.n_rounds + 1):
        r = trace.rounds[t - 1]
        paid = []
        for role in ("base", "guide"):
            usage = _paid_usage(trace, ladder, t, role, start)
            if usage is not None:
                paid.append((getattr(r, role).model, usage))
        out.append(paid)
    return out


def started_rounds(trace: Any, start: int) -> list[Any]:
    """The rounds a question started at round ``start + 1`` shows the featurizer, as the live
    agent runs them: blanks, then the trace's rounds, a repeat that is called again carrying
    its original's usage (its recorded usage is zero)."""
    ladder = ladder_of_trace(trace)
    out = routed_rounds(trace.rounds, start)
    for t in range(start + 1, trace.n_rounds + 1):
        r = trace.rounds[t - 1]
        update = {}
        for role in ("base", "guide"):
            s = getattr(r, role)
            usage = _paid_usage(trace, ladder, t, role, start)
            if getattr(s, "reused", False) and usage is not None:
                update[role] = s.model_copy(update={"usage": usage})
        if update:
            out[t - 1] = r.model_copy(update=update)
    return out


@dataclass(frozen=True)
class RouteViews:
    """Every start's view of a trace set: ``obs`` [S, N, T, F] (float32), ``cost`` [S, N, T]
    (USD of round t when started at s; 0 before s), the question texts [N] and ``latency``
    [S, N, T] (estimated seconds of round t when started at s: the longest of the calls it
    pays, sent at once; 0 before s; :mod:`ccpo.traces.latency`)."""

    obs: np.ndarray
    cost: np.ndarray
    questions: tuple[str, ...]
    latency: np.ndarray | None = None
    #: [N, D] the questions' recorded embeddings (:func:`question_embeddings`), else None
    embeddings: np.ndarray | None = None
    embedding_model: str | None = None

    def subset(self, idx: np.ndarray) -> RouteViews:
        idx = np.asarray(idx)
        lat = None if self.latency is None else self.latency[:, idx]
        emb = None if self.embeddings is None else self.embeddings[idx]
        return RouteViews(
            self.obs[:, idx], self.cost[:, idx], tuple(self.questions[i] for i in idx), lat,
            emb, self.embedding_model,
        )  # fmt: skip


def question_embeddings(traces: Sequence[Any]) -> tuple[np.ndarray | None, str | None]:
    """([N, D] the traces' question embeddings, their model) when every trace records one by
    the same model with the same length (``ccpo traces embed``); else (None, None)."""
    got = [getattr(tr, "question_embedding", None) for tr in traces]
    if not got or any(e is None for e in got):
        return None, None
    models = {e.model for e in got}
    dims = {len(e.vector) for e in got}
    if len(models) != 1 or len(dims) != 1:
        return None, None
    return np.asarray([e.vector for e in got], dtype=np.float64), models.pop()


def route_views(traces: Sequence[Any], prices: PriceTable) -> RouteViews | None:
    """The :class:`RouteViews` of a trace set (one T), or ``None`` when some trace is not
    :func:`routable` or T < 2."""
    if not traces or traces[0].n_rounds < 2 or not all(routable(tr) for tr in traces):
        return None
    T, N = traces[0].n_rounds, len(traces)
    obs = np.zeros((T, N, T, 0), dtype=np.float32)
    cost = np.zeros((T, N, T))
    latency = np.zeros((T, N, T))
    for i, tr in enumerate(traces):
        for s in range(T):
            rows = featurize_rounds(
                tr.task, T, started_rounds(tr, s), tr.family, tuple(tr.signals or ())
            )
            if obs.shape[-1] == 0:
                obs = np.zeros((T, N, T, rows.shape[-1]), dtype=np.float32)
            obs[s, i] = rows
            for k, steps in enumerate(paid_steps(tr, s)):
                cost[s, i, s + k] = sum(prices.usage_cost(m, u) for m, u in steps)
                calls = [call_seconds(u.output_tokens) for _, u in steps]
                # a verify step's verifier reads the reply (one after the other); an agree
                # round's calls go at once
                after = tr.rounds[s + k].verdict_mode == "verify"
                latency[s, i, s + k] = sum(calls) if after else max(calls, default=0.0)
    emb, model = question_embeddings(traces)
    return RouteViews(obs, cost, tuple(tr.question for tr in traces), latency, emb, model)
