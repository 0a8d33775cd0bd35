"""Featurizer: the observation o_t of round t, computed from rounds 1..t only.

The paper's o_t (§3, "POMDP formulation") holds the base model's context, the guide's judgment
and uncertainty, the round index and the cumulative guide token usage. We encode it as a fixed
vector of numbers; nothing from later rounds and nothing from ``correct`` or ``gold`` enters it.
Missing values (null log-probs, null uncertainty, null verdict) are encoded as 0 with an
explicit ``*_missing`` flag, never crashed on.

The spec (:data:`FEATURE_SPEC`) is versioned and saved with anything trained on it; loading an
artifact whose spec differs fails loudly instead of feeding a network the wrong columns. A
ladder's ``signals`` (:mod:`ccpo.traces.signals`) append their columns after these, and the
spec then names them (:func:`feature_spec`); without signals it is :data:`FEATURE_SPEC`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ccpo.traces.answers import normalizer_for
from ccpo.traces.schema import Trace
from ccpo.traces.signals import normalize_signals, signal_columns, signal_names

FEATURE_VERSION = "ccpo.features/v1"

FEATURE_NAMES: tuple[str, ...] = (
    "round_frac",  # t / T
    "is_last_round",  # t == T ('next' is masked there)
    "verdict_yes",  # guide said Yes (0 when No or missing)
    "verdict_missing",
    "guide_uncertainty",  # as logged, clipped to [0, 5]; 0 when missing
    "guide_uncertainty_missing",
    "base_logprob_mean",  # clipped to [-10, 0]; 0 when missing
    "base_logprob_min_scaled",  # logprob_min / 5, clipped to [-4, 0]; 0 when missing
    "base_logprob_missing",
    "base_agrees_guide",  # normalised base answer == normalised guide answer (round t)
    "base_agrees_prev_base",  # share of rounds < t whose base answer equals this one
    "guide_agrees_prev_guide",  # share of rounds < t whose guide answer equals this one
    "base_in_prev_guide",  # this base answer equals some earlier guide answer
    "prev_yes_share",  # share of rounds < t where the guide said Yes
    "cum_guide_tokens",  # log1p(cumulative guide tokens over rounds 1..t / 1000)
    "cum_base_tokens",  # log1p(cumulative base tokens over rounds 1..t / 1000)
    "base_answer_len",  # log1p(characters of the base answer) / 5
    "guide_answer_len",  # log1p(characters of the guide answer) / 5
    "base_answer_empty",  # the base gave no answer
)

FEATURE_SPEC: dict[str, Any] = {"version": FEATURE_VERSION, "names": list(FEATURE_NAMES)}
N_FEATURES = len(FEATURE_NAMES)


def feature_spec(signals: Sequence[str] = ()) -> dict[str, Any]:
    """The spec of observations with ``signals``' columns: :data:`FEATURE_SPEC` itself
    without signals (so folders without signals are written as before)."""
    if not signals:
        return dict(FEATURE_SPEC)
    names = [*FEATURE_NAMES, *signal_names(signals)]
    return {"version": FEATURE_VERSION, "names": names, "signals": list(signals)}


def spec_signals(spec: dict[str, Any] | None) -> tuple[str, ...]:
    """The signals a feature spec was built with (none for a v1 spec without them)."""
    return tuple((spec or {}).get("signals") or ())


def _share_equal(value: str, earlier: Sequence[str]) -> float:
    return sum(value == e for e in earlier) / len(earlier) if earlier else 0.0


def featurize_trace(trace: Trace) -> np.ndarray:
    """Observations of every round of one trace, shape ``[T, N_FEATURES]`` (float32).

    Row ``t-1`` depends on rounds ``1..t`` only (no peeking at later rounds or at ``correct``).
    """
    return featurize_rounds(
        trace.task, trace.n_rounds, trace.rounds, trace.family, tuple(trace.signals or ())
    )


def featurize_rounds(
    task: str,
    horizon: int,
    rounds: Sequence[Any],
    family: str | None,
    signals: Sequence[str],
) -> np.ndarray:
    """Observations of the rounds run so far, shape ``[len(rounds), N_FEATURES]``.

    ``rounds`` are :class:`~ccpo.traces.schema.Round` objects or anything with the same
    attributes (``base.answer``, ``base.usage``, ``base.logprob_mean``, ``base.logprob_min``,
    ``guide.answer``, ``guide.verdict``, ``guide.uncertainty``, ``guide.usage``); ``correct``
    is never read, so a live agent can featurize round t as soon as it has run.
    ``horizon`` is T, the round budget (it sets ``round_frac`` and ``is_last_round``);
    ``family`` the task's answer family (:func:`ccpo.traces.answers.family_of`);
    ``signals`` the ladder's signals, whose columns follow (:func:`feature_spec`): no
    default, so that no caller (training, routing, the live agent) can leave them out and
    fit on other columns than it serves.
    """
    norm = normalizer_for(task, family)
    T = horizon
    out = np.zeros((len(rounds), N_FEATURES), dtype=np.float32)
    base_norm: list[str] = []
    guide_norm: list[str] = []
    verdicts: list[bool] = []
    cum_guide = cum_base = 0
    for i, r in enumerate(rounds):
        t = i + 1
        b, g = r.base, r.guide
        nb, ng = norm(b.answer), norm(g.answer)
        cum_guide += g.usage.input_tokens + g.usage.output_tokens
        cum_base += b.usage.input_tokens + b.usage.output_tokens
        lp_missing = b.logprob_mean is None or b.logprob_min is None
        row = (
            t / T,
            float(t == T),
            float(g.verdict == "yes"),
            float(g.verdict is None),
            0.0 if g.uncertainty is None else min(max(g.uncertainty, 0.0), 5.0),
            float(g.uncertainty is None),
            0.0 if lp_missing else min(max(b.logprob_mean, -10.0), 0.0),
            0.0 if lp_missing else min(max(b.logprob_min / 5.0, -4.0), 0.0),
            float(lp_missing),
            float(nb == ng and nb != ""),
            _share_equal(nb, base_norm),
            _share_equal(ng, guide_norm),
            float(nb in guide_norm),
            sum(verdicts) / len(verdicts) if verdicts else 0.0,
            math.log1p(cum_guide / 1000.0),
            math.log1p(cum_base / 1000.0),
            math.log1p(len(b.answer)) / 5.0,
            math.log1p(len(g.answer)) / 5.0,
            float(nb == ""),
        )
        out[i] = row
        base_norm.append(nb)
        guide_norm.append(ng)
        verdicts.append(g.verdict == "yes")
    if signals:
        extra = signal_columns(rounds, signals).astype(np.float32)
        return np.concatenate([out, extra], axis=1)
    return out


def check_spec(spec: dict[str, Any]) -> None:
    """Raise if a saved feature spec is not the one this version computes."""
    from ccpo.errors import CCPOError

    try:
        signals = normalize_signals(spec_signals(spec), "-", "features.json")
    except CCPOError as e:
        raise CCPOError(f"{e}: the policy was made by a newer ccpo; upgrade ccpo") from None
    expected = feature_spec(signals)["names"]
    if spec.get("version") != FEATURE_VERSION or list(spec.get("names", [])) != expected:
        raise CCPOError(
            f"feature spec mismatch: the artifact was trained on {spec.get('version')!r} "
            f"with {len(spec.get('names', []))} features, this ccpo computes {FEATURE_VERSION!r} "
            f"with {len(expected)}. Retrain the policy with this version of ccpo."
        )
