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


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _words(text: str) -> float:
    return math.log1p(word_count(text)) / 5.0


def _round_row(r: Any, signals: Sequence[str]) -> list[float]:
    b, g = r.base, r.guide
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
    row t from round t alone: the classifier's [o_t, o_{t−1}] pairs rounds)."""
    k = len(signal_names(signals))
    out = np.zeros((len(rounds), k))
    for i, r in enumerate(rounds):
        out[i] = _round_row(r, signals)
    return out
