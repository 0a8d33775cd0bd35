"""Estimated end-to-end latency of a policy, from the traces' usage: a first-class number
beside cost.

Trace files record no wall times (``ccpo.trace/v1`` has no latency field), so a call's time is
estimated from what it wrote: :data:`FIRST_TOKEN_SECONDS` to the first token, then
``output_tokens`` at :data:`TOKENS_PER_SECOND` (stated defaults, the same for every model; the
ranking of policies depends on them only through the share of tokens each pays). A round's
time follows how it runs (:func:`ccpo.llm.protocol.run_round`): an ``agree`` round sends its
calls at once (the longer one counts), a ``judge`` round's guide waits for its base (the two
add up); a reused step costs no time. A question's latency is the sum over the rounds run.

Main names: :func:`call_seconds`, :func:`round_seconds`, :func:`question_latency`,
:func:`mean_latency`.
Docs: docs/design.md, "How evaluation works"; docs/glossary.md, "estimated latency".
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: output tokens per second of a call (a stated default, not a measurement)
TOKENS_PER_SECOND = 50.0
#: seconds to the first token of a call (a stated default, not a measurement)
FIRST_TOKEN_SECONDS = 0.5


def call_seconds(output_tokens: int) -> float:
    """The estimated time of one call that wrote ``output_tokens``."""
    return FIRST_TOKEN_SECONDS + output_tokens / TOKENS_PER_SECOND


def _step_seconds(step: Any) -> float:
    return 0.0 if getattr(step, "reused", False) else call_seconds(step.usage.output_tokens)


def round_seconds(r: Any) -> float:
    """A round's estimated time: the longer of an ``agree`` round's calls (sent at once), the
    sum of a ``judge`` round's (its guide reads the base's answer)."""
    b, g = _step_seconds(r.base), _step_seconds(r.guide)
    return max(b, g) if getattr(r, "verdict_mode", None) == "agree" else b + g


def question_latency(round_latency: np.ndarray, idx: Any, length: np.ndarray) -> np.ndarray:
    """Seconds per question of ``idx`` having run its first ``length`` rounds (shapes alike),
    from ``round_latency`` [N, T]."""
    cum = np.cumsum(round_latency, axis=-1)
    rows = cum if idx is None else cum[np.asarray(idx)]
    last = np.clip(np.asarray(length, dtype=np.int64), 1, round_latency.shape[-1]) - 1
    return np.take_along_axis(rows, last[..., None], -1)[..., 0]


def mean_latency(round_latency: np.ndarray | None, idx: Any, m: Any) -> float:
    """Mean seconds per question of the outcomes ``m`` (a :class:`~ccpo.traces.episodes.Metrics`
    of the questions ``idx``): its own latency when the rollout set one, else its rounds run;
    nan when the traces give no estimate."""
    if m.latency is not None:
        return float(np.mean(m.latency))
    if round_latency is None:
        return float("nan")
    return float(np.mean(question_latency(round_latency, idx, m.length)))
