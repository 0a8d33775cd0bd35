"""Which signals a ladder uses, what a round records of them, and the features they add.

A ladder's ``signals`` (data, like its rounds: :class:`ccpo.traces.ladder.Ladder`) name
groups of features appended after the ``ccpo.features/v1`` columns; a ladder without signals
gets exactly the v1 columns, so older policies see the same observations bit for bit.

- :data:`SIGNALS`: the names, in their canonical order, and :data:`SIGNAL_FEATURES` the
  columns of each; :func:`normalize_signals` checks and orders a list.
- :func:`text_signals`: what a round records of the pure signals (lexical similarity of the
  base and guide replies, refusal markers), the same at collect, import and serve time.
- :func:`signal_columns`: the extra columns of rounds 1..t; the pure ones are recomputed
  from the answers, the ones that need a call (``embedding``, ``verdict``) read from the
  round's recorded ``signals``.
- :func:`is_solo`, :func:`compared`: a **one-model step** (a round whose guide repeats its
  base's call: one reply, paid once) is compared with the reply of the step before it, so its
  columns say how this reply relates to the last one paid for: "base" is the previous step's
  reply (blank at the first step run), "guide" this step's. A pair round compares its base
  and guide replies, as before. A **verify step** (:func:`is_verify`: a verifier's verdict on
  the reply of the step before it) sees that reply's columns: against the reply before it.

Contract: docs/design.md, section "Signals"; the maths: :mod:`ccpo.traces.similarity`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.traces.similarity import char_ngram_cosine, is_refusal, word_count, word_jaccard

#: the signal names, in the order their columns follow the v1 features
SIGNALS: tuple[str, ...] = ("similarity", "embedding", "length", "refusal", "logprob", "verdict")

SIGNAL_FEATURES: dict[str, tuple[str, ...]] = {
    "similarity": ("sim_words", "sim_chars"),  # base vs guide reply of round t: lexical
    "embedding": ("sim_embedding", "sim_embedding_missing"),  # cosine; 0 and 1 when missing
    "length": ("base_words", "guide_words", "length_ratio"),  # log1p(words)/5; log ratio
    "refusal": ("base_refusal", "guide_refusal"),  # a refusal marker near the start
    "logprob": ("base_confidence", "guide_confidence", "confidence_gap"),  # on a p scale
    "verdict": ("judge_yes", "judge_no", "judge_uncertainty"),  # free-text verdict call
}

#: the signals that need a call (recorded in the round; the others are pure functions)
CALLED_SIGNALS = ("embedding", "verdict")


def normalize_signals(
    names: Iterable[str], embedding_model: str | None = None, where: str = "signals"
) -> tuple[str, ...]:
    """``names`` checked, without repeats, in canonical order; a :class:`CCPOError` names an
    unknown signal, or ``embedding`` without an embedding model."""
    got = [str(n).strip().lower() for n in names]
    unknown = [n for n in got if n not in SIGNALS]
    if unknown:
        raise CCPOError(
            f"{where}: unknown signal {', '.join(repr(u) for u in unknown)}; "
            f"known: {', '.join(SIGNALS)}"
        )
    if "embedding" in got and not embedding_model:
        raise CCPOError(f"{where}: the 'embedding' signal needs an embedding_model")
    return tuple(s for s in SIGNALS if s in got)


def signal_names(signals: Sequence[str]) -> list[str]:
    """The feature names ``signals`` add, in order."""
    return [f for s in signals for f in SIGNAL_FEATURES[s]]


def text_signals(base_answer: str, guide_answer: str) -> dict[str, Any]:
    """The pure signals a round records: word-set Jaccard and character 3-gram cosine of the
    base and guide replies, and whether each opens with a refusal marker."""
    return {
        "sim_words": word_jaccard(base_answer, guide_answer),
        "sim_chars": char_ngram_cosine(base_answer, guide_answer),
        "base_refusal": is_refusal(base_answer),
        "guide_refusal": is_refusal(guide_answer),
    }


def is_solo(r: Any) -> bool:
    """Whether round ``r`` is a one-model step: an ``agree`` round whose guide is its base's
    model with its prompt (the same call, paid once; docs/design.md, "Ladders")."""
    b, g = r.base, r.guide
    return (
        _get(r, "verdict_mode") == "agree"
        and b.model == g.model
        and _get(b, "prompt") == _get(g, "prompt")
    )


def is_verify(r: Any) -> bool:
    """Whether round ``r`` is a verify step: its base repeats the reply of the one-model step
    before it (``reused``, paid there) and its guide is a verifier's Yes/No on that reply
    (docs/design.md, "Ladders", "The verify step")."""
    return _get(r, "verdict_mode") == "verify"


def _one_reply(r: Any) -> bool:
    """A round whose base is its one reply (a one-model step or a verify step)."""
    return is_solo(r) or is_verify(r)


class _Blank:
    """The reply of no step (before the first step run): empty, without log-probs."""

    answer = ""
    logprob_mean = None
    uncertainty = None


def compared(rounds: Sequence[Any], i: int) -> tuple[Any, Any]:
    """The two replies round ``i``'s signal columns compare, as (earlier, later) steps with
    ``answer``, ``logprob_mean`` and ``uncertainty``: a pair round's base and guide; a
    one-model step's predecessor (the previous round's latest reply; blank at the first) and
    itself.
    A verify step's are the columns of the reply it verifies (that step's predecessor and
    the reply), so they never compare the reply with itself.
    Confidence of a one-model step's reply: its base's ``logprob_mean`` (exp is p)."""
    r = rounds[i]
    if is_verify(r):
        j = i - 1  # the verified step (a routed start skipped it: a blank round there)
        if j >= 0 and is_solo(rounds[j]) and _same_call(rounds[j].base, r.base):
            j -= 1
        return _latest(rounds, j), _Reply(r.base)
    if not is_solo(r):
        return r.base, r.guide
    return _latest(rounds, i - 1), _Reply(r.base)


def _same_call(a: Any, b: Any) -> bool:
    return a.model == b.model and _get(a, "prompt") == _get(b, "prompt")


def _latest(rounds: Sequence[Any], j: int) -> Any:
    """The latest reply of round ``j`` (blank before the first): a one-model or verify step's
    reply (its base), a pair's guide (a skipped round's: blank)."""
    if j < 0:
        return _Blank()
    prev = rounds[j]
    return _Reply(prev.base if _one_reply(prev) else prev.guide)


class _Reply:
    """A step's reply seen as either role: its probability p (exp of a base's mean
    log-prob, or 1 − a guide's uncertainty) as both a base score and a guide uncertainty."""

    def __init__(self, step: Any) -> None:
        self.answer = step.answer or ""
        lp, u = getattr(step, "logprob_mean", None), getattr(step, "uncertainty", None)
        p = math.exp(lp) if lp is not None else (None if u is None else 1.0 - u)
        self.logprob_mean = None if p is None else math.log(max(p, 1e-6))
        self.uncertainty = None if p is None else 1.0 - p


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _words(text: str) -> float:
    return math.log1p(word_count(text)) / 5.0


def _round_row(rounds: Sequence[Any], i: int, signals: Sequence[str]) -> list[float]:
    r = rounds[i]
    b, g = compared(rounds, i)
    rec = _get(r, "signals")
    row: list[float] = []
    for s in signals:
        if s == "similarity":
            row += [word_jaccard(b.answer, g.answer), char_ngram_cosine(b.answer, g.answer)]
        elif s == "embedding":
            v = _get(rec, "sim_embedding")
            row += [0.0, 1.0] if v is None else [float(v), 0.0]
        elif s == "length":
            wb, wg = word_count(b.answer), word_count(g.answer)
            ratio = min(max(math.log((1 + wg) / (1 + wb)), -5.0), 5.0)
            row += [math.log1p(wb) / 5.0, math.log1p(wg) / 5.0, ratio]
        elif s == "refusal":
            row += [float(is_refusal(b.answer)), float(is_refusal(g.answer))]
        elif s == "logprob":
            pb = None if b.logprob_mean is None else math.exp(b.logprob_mean)
            pg = None if g.uncertainty is None else 1.0 - min(max(g.uncertainty, 0.0), 1.0)
            gap = 0.0 if pb is None or pg is None else pg - pb
            row += [pb or 0.0, pg or 0.0, gap]
        elif s == "verdict":
            v = _get(rec, "verdict")
            said, u = _get(v, "verdict"), _get(v, "uncertainty")
            row += [float(said == "yes"), float(said == "no"), 0.0 if u is None else float(u)]
    return row


def signal_columns(rounds: Sequence[Any], signals: Sequence[str]) -> np.ndarray:
    """The columns ``signals`` add for each of ``rounds``, shape [len(rounds), k] (float64;
    row t from round t alone, a one-model step's from it and the step before:
    :func:`compared`; the classifier's [o_t, o_{t−1}] pairs rounds)."""
    k = len(signal_names(signals))
    out = np.zeros((len(rounds), k))
    for i in range(len(rounds)):
        out[i] = _round_row(rounds, i, signals)
    return out
